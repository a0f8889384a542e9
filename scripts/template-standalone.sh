#!/usr/bin/env bash
# Builds plugin-template/rust the way a plugin author would: copied out of this repository,
# with nothing inherited from the workspace, then checks the component with the host.
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp -rL plugin-template/rust "$work/my-plugin"
cp rust-toolchain.toml "$work/my-plugin/"
(
  cd "$work/my-plugin"
  CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/flotilla-target}/template-standalone" \
    cargo build --quiet --release --target wasm32-wasip2
)
wasm="${CARGO_TARGET_DIR:-$HOME/.cache/flotilla-target}/template-standalone/wasm32-wasip2/release/flotilla_plugin_template.wasm"
test -s "$wasm"
echo "standalone template built: $(stat -c %s "$wasm") bytes"
flotilla="${CARGO_TARGET_DIR:-$HOME/.cache/flotilla-target}/release/flotilla"
[ -x "$flotilla" ] || cargo build --locked --release -p flotilla
"$flotilla" plugin check "$wasm"
