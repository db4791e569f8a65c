#!/usr/bin/env bash
# Two clones of this repository on one machine each import their own code after `make setup`
# in both (issue: a shared venv used to re-point its editable install at the last clone set up).
# Prints the setup time of each clone (the package cache is warm after the first setup).
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for name in a b; do
  git clone -q "$src" "$work/$name"
done
for name in a b; do
  t0=$(date +%s%N)
  RLINF_SKIP_APT=1 make -s -C "$work/$name" setup >/dev/null
  ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  echo "[two-clones] make setup in clone $name: $((ms / 1000)).$(printf %03d $((ms % 1000))) s"
done
for name in a b; do
  got=$(cd / && "$work/$name/.venv/bin/python" -c '
import os, rlinf_embodied, rlinf_embodied.envs, rlinf_embodied.policies, rlinf_embodied.eval, rlinf_embodied.configs
print(" ".join(os.path.dirname(os.path.realpath(m.__file__)) for m in
      (rlinf_embodied, rlinf_embodied.envs, rlinf_embodied.policies, rlinf_embodied.eval, rlinf_embodied.configs)))')
  root=$(realpath "$work/$name")
  want="$root/rlinf_embodied $root/envs $root/policies $root/eval $root/configs"
  if [ "$got" != "$want" ]; then
    echo "[two-clones] FAIL: clone $name imports $got" >&2
    exit 1
  fi
  cli=$(cd / && "$work/$name/.venv/bin/rlinf-embodied" --version)
  echo "[two-clones] clone $name imports its own code ($cli)"
done
