#!/usr/bin/env bash
# Builds flotilla and the static plugin, then checks the plugin against the example hosts.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -f "$HOME/.cargo/env" ] && . "$HOME/.cargo/env"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/flotilla-target}"
rustup target list --installed | grep -qx wasm32-wasip2 || rustup target add wasm32-wasip2

cargo build --locked --release -p flotilla
cargo build --locked --profile guest --target wasm32-wasip2 -p flotilla-plugin-static
"$CARGO_TARGET_DIR/release/flotilla" plugin check \
  "$CARGO_TARGET_DIR/wasm32-wasip2/guest/flotilla_plugin_static.wasm" \
  --settings examples/static-hosts.toml "$@"
