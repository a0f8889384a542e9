#!/usr/bin/env bash
# Builds flotilla and the static plugin, then runs examples/quickstart.toml: a pool of four
# local "machines" with the lease API on http://127.0.0.1:8080 (Ctrl-C drains and stops).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -f "$HOME/.cargo/env" ] && . "$HOME/.cargo/env"
. scripts/toolchain.sh
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/flotilla-target}"
rustup target list --installed | grep -qx wasm32-wasip2 || rustup target add wasm32-wasip2

cargo build --locked --release -p flotilla
cargo build --locked --profile guest --target wasm32-wasip2 -p flotilla-plugin-static
mkdir -p examples/plugins
cp "$CARGO_TARGET_DIR/wasm32-wasip2/guest/flotilla_plugin_static.wasm" examples/plugins/static.wasm
"$CARGO_TARGET_DIR/release/flotilla" plugin check examples/plugins/static.wasm
exec "$CARGO_TARGET_DIR/release/flotilla" run -c examples/quickstart.toml "$@"
