# Sourced by setup.sh and lock.sh: installs uv into $CACHE/tools if missing, sets UV (its path)
# and the UV_* variables: uv's cache outside the clone, and the package indexes / find-links that
# pip is configured with (uv reads no pip configuration).
UV="$CACHE/tools/bin/uv"
if [ ! -x "$UV" ]; then
  echo "[setup] installing uv into $CACHE/tools"
  mkdir -p "$CACHE"
  "$PYTHON" -m venv "$CACHE/tools"
  "$CACHE/tools/bin/python" -m pip install -q uv
fi
export UV_CACHE_DIR="$CACHE/uv"
pipcfg=$("$PYTHON" -m pip config list 2>/dev/null || true)
_pipcfg() { printf '%s\n' "$pipcfg" | sed -n "s/^[^=]*\.$1='\(.*\)'$/\1/p" | tr '\n' ' '; }
_extra="$(_pipcfg extra-index-url) ${RLINF_TORCH_INDEX:-}"
_links=$(_pipcfg find-links)
_index=$(_pipcfg index-url)
[ -z "${_extra// /}" ] || export UV_EXTRA_INDEX_URL="$_extra"
[ -z "${_links// /}" ] || export UV_FIND_LINKS="$(echo $_links | tr ' ' ',')"
[ -z "${_index// /}" ] || export UV_DEFAULT_INDEX="${_index%% *}"
# Several indexes may each hold some versions of a package: take the best match from any.
export UV_INDEX_STRATEGY=unsafe-best-match
