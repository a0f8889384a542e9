#!/usr/bin/env bash
# The plugin templates as an author meets them: `flotilla plugin new` writes each one (from the
# copies embedded in the binary) into an empty directory outside this repository, it is built
# with its own toolchain (cargo, componentize-py from PyPI, componentize-js from npm), and the
# conformance kit runs every rule against the built-in example cloud, provisioning included.
# Prints how long each language took from `plugin new` to a passing `plugin test`.
set -euo pipefail
cd "$(dirname "$0")/.."
target="${CARGO_TARGET_DIR:-$HOME/.cache/flotilla-target}"
# The binary the test run's tests ran (scripts/test.sh sets FLOTILLA_MUSL_DIR); otherwise the
# test-run profile's, built when missing.
flotilla="${FLOTILLA_MUSL_DIR:-$target/test-run}/flotilla"
[ -x "$flotilla" ] || cargo build --locked --profile test-run -p flotilla --bin flotilla
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cache="$HOME/.cache/flotilla-templates"   # venv, npm cache and cargo target, reused by reruns
mkdir -p "$cache"

run() { # LANG BUILD... : new, build, test; the elapsed seconds
  local lang=$1; shift
  local start=$SECONDS
  (cd "$work" && "$flotilla" plugin new "demo-$lang" --lang "$lang" >/dev/null)
  (cd "$work/demo-$lang" && "$@")
  local wasm
  case $lang in
    rust) wasm="$cache/rust-target/wasm32-wasip2/release/demo_rust.wasm" ;;
    *) wasm="$work/demo-$lang/plugin.wasm" ;;
  esac
  local report="$work/$lang.report"
  XDG_CACHE_HOME="$work/cache" FLOTILLA_LOG=warn \
    "$flotilla" plugin test "$wasm" --example-cloud --provision --timeout 60s | tee "$report"
  # The template passes the example cloud's zone through `connect-info` (contract 0.1.4).
  grep -q 'provision.connect-info .* in zone example-1a' "$report" \
    || { echo "the $lang template's connect-info carries no zone" >&2; exit 1; }
  echo "== $lang: plugin new -> plugin test --provision passed in $((SECONDS - start)) s"
}

toolchain=$(sed -n 's/^channel *= *"\(.*\)"/\1/p' rust-toolchain.toml)
run rust env RUSTUP_TOOLCHAIN="$toolchain" CARGO_TARGET_DIR="$cache/rust-target" cargo build --quiet --release --target wasm32-wasip2
run python env VENV="$cache/python-venv" ./build.sh
run js sh -c "npm ci --no-audit --no-fund --cache '$cache/npm' >/dev/null && npm run --silent build"
