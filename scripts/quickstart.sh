#!/usr/bin/env bash
# Installs flotilla from this checkout (scripts/install.sh: ~/.local/bin/flotilla, or
# /usr/local/bin as root), then runs examples/quickstart.toml with it: a pool of four local
# "machines" served by the built-in static plugin, with the lease API on
# http://127.0.0.1:8080 (Ctrl-C drains and stops).
set -euo pipefail
cd "$(dirname "$0")/.."
flotilla=$(./scripts/install.sh "$@" | tail -1)
"$flotilla" config check -c examples/quickstart.toml
exec "$flotilla" run -c examples/quickstart.toml
