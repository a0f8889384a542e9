#!/usr/bin/env bash
# Builds plugin.wasm, a component of world flotilla:provider/provider, from app.py.
#
#   ./build.sh                 # venv in ./.venv, component in ./plugin.wasm
#   VENV=/tmp/venv OUT=/tmp/p.wasm ./build.sh
#
# Needs python3 (3.9 or later, with venv) and PyPI. The component bundles its own CPython, so
# the local Python version does not matter for the result.
set -euo pipefail
cd "$(dirname "$0")"
venv="${VENV:-$PWD/.venv}"
out="${OUT:-$PWD/plugin.wasm}"
world="flotilla:provider/provider"

if [ ! -x "$venv/bin/componentize-py" ] || ! "$venv/bin/pip" freeze 2>/dev/null | grep -qxFf requirements.txt; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r requirements.txt
fi

# Typed bindings for editors and type checkers only; componentize generates its own copy.
rm -rf bindings
"$venv/bin/componentize-py" -q -d wit -w "$world" bindings bindings

# Run without VIRTUAL_ENV so the venv's site-packages (componentize-py itself) is not bundled:
# only src/ (app.py, flotilla_http.py) and the standard library go into the component.
env -u VIRTUAL_ENV "$venv/bin/componentize-py" -q -d wit -w "$world" componentize app -p src -o "$out"
echo "built $out ($(stat -c %s "$out") bytes)"
