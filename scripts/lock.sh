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
