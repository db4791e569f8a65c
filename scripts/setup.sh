#!/usr/bin/env bash
# Set up rlinf-embodied on Debian 12 (root or sudo), idempotent and quiet when nothing is missing.
#
#   1. system packages: Mesa >= 25 Vulkan (lavapipe, from bookworm-backports; SAPIEN needs
#      VK_KHR_external_semaphore_fd, which Debian 12's Mesa 22.3 lacks), EGL/OSMesa for MuJoCo,
#      ffmpeg for videos;
#   2. a virtual environment. The heavy dependencies live in a venv cached outside the clone,
#      keyed by the hash of pyproject.toml and this script, and `.venv` links to it, so a fresh
#      clone (CI) reuses it; only the editable install of this clone is redone;
#   3. torch (+ torchvision, which timm needs) before the project, so the project's torch range
#      is already satisfied; then the project with [all,dev].
#
# Environment: RLINF_CACHE (default ~/.cache/rlinf-embodied), RLINF_TORCH_INDEX (a pip index URL
# for torch wheels, e.g. PyTorch's CPU-only index), RLINF_SKIP_APT=1 (skip system packages),
# PYTHON (interpreter to build the venv from, default python3).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PYTHON=${PYTHON:-python3}
CACHE=${RLINF_CACHE:-$HOME/.cache/rlinf-embodied}
TORCH_VERSION=2.14.1        # torchvision 0.29.1 pairs with it; timm (VLA backbones) needs torchvision
TORCHVISION_VERSION=0.29.1
say() { echo "[setup] $*"; }

# ---- 1. system packages -------------------------------------------------------------------
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
    if grep -qs bookworm /etc/os-release && ! grep -rqs bookworm-backports /etc/apt/sources.list /etc/apt/sources.list.d/; then
      echo "deb http://deb.debian.org/debian bookworm-backports main" | $SUDO tee /etc/apt/sources.list.d/backports.list >/dev/null
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

# ---- 2. virtual environment --------------------------------------------------------------
# The key covers what decides the installed packages (dependency lists, torch pins), not the
# rest of pyproject.toml, so editing e.g. the package list does not rebuild the environment.
deps=$("$PYTHON" -c 'import json, tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; print(json.dumps([p["dependencies"], p["optional-dependencies"]], sort_keys=True))' 2>/dev/null || cat pyproject.toml)
key=$(printf '%s\n%s %s\n' "$deps" "$TORCH_VERSION" "$TORCHVISION_VERSION" | sha256sum | cut -c1-12)
VENV="$CACHE/venv-$key"
if [ ! -f "$VENV/.rlinf-complete" ]; then
  say "creating the environment in $VENV (several minutes the first time)"
  mkdir -p "$CACHE"
  rm -rf "$VENV"
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip setuptools wheel
  torch_args=()
  [ -n "${RLINF_TORCH_INDEX:-}" ] && torch_args+=(--index-url "$RLINF_TORCH_INDEX")
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    say "NVIDIA GPU found: installing the CUDA build of torch"
  else
    say "no NVIDIA GPU: torch runs on the CPU"
  fi
  "$VENV/bin/python" -m pip install -q "torch==$TORCH_VERSION" "torchvision==$TORCHVISION_VERSION" "${torch_args[@]}"
  "$VENV/bin/python" -m pip install -q -e ".[all,dev]"
  touch "$VENV/.rlinf-complete"
fi
if [ "$(readlink .venv 2>/dev/null)" != "$VENV" ]; then
  if [ -e .venv ] && [ ! -L .venv ]; then
    say "replacing the plain directory .venv with a link to $VENV"
    rm -rf .venv
  fi
  ln -sfn "$VENV" .venv
fi
# The cached venv is shared between clones: make sure it imports *this* clone (checked from
# outside the repo, where the current directory cannot mask the editable install's mapping).
here=$(cd / && "$ROOT/.venv/bin/python" -c '
import os, rlinf_embodied, rlinf_embodied.envs, rlinf_embodied.policies, rlinf_embodied.eval
mods = (rlinf_embodied, rlinf_embodied.envs, rlinf_embodied.policies, rlinf_embodied.eval)
print(" ".join(os.path.dirname(os.path.realpath(m.__file__)) for m in mods))' 2>/dev/null || true)
want="$(realpath "$ROOT")/rlinf_embodied $(realpath "$ROOT")/envs $(realpath "$ROOT")/policies $(realpath "$ROOT")/eval"
if [ "$here" != "$want" ]; then
  if ! out=$(.venv/bin/python -m pip install -q --no-deps -e . 2>&1); then
    echo "$out" >&2
    exit 1
  fi
fi
