#!/usr/bin/env bash
# Installs flotilla.
#
#   scripts/install.sh --from DIR-or-URL [--prefix DIR]
#       No Rust needed: takes the static Linux binary (flotilla-x86_64-unknown-linux-musl) and
#       SHA256SUMS from a release directory or URL (what scripts/release.sh writes), checks the
#       binary against its checksum, and installs it as PREFIX/bin/flotilla.
#   scripts/install.sh [--prefix DIR]
#       From this checkout, with Rust (rustup): `cargo install --locked --path host/flotilla`
#       into PREFIX (the official plugins are built into the binary, so the wasm32-wasip2
#       target is added when missing).
#
# PREFIX defaults to /usr/local as root, ~/.local otherwise. Prints the installed path.
set -euo pipefail
from="" prefix=""
while [ $# -gt 0 ]; do
  case "$1" in
    --from) from="${2:?--from needs a directory or URL}"; shift 2 ;;
    --prefix) prefix="${2:?--prefix needs a directory}"; shift 2 ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "install.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
if [ -z "$prefix" ]; then
  if [ "$(id -u)" = 0 ]; then prefix=/usr/local; else prefix="$HOME/.local"; fi
fi
mkdir -p "$prefix/bin"
artifact=flotilla-x86_64-unknown-linux-musl

if [ -n "$from" ]; then
  [ "$(uname -s)-$(uname -m)" = "Linux-x86_64" ] \
    || { echo "install.sh: the release binary is for Linux x86_64; this is $(uname -s) $(uname -m)" >&2; exit 1; }
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  fetch() {
    case "$from" in
      http://*|https://*)
        if command -v curl >/dev/null; then curl -fsSL "$from/$1" -o "$work/$1"
        else wget -q "$from/$1" -O "$work/$1"; fi ;;
      *) cp "$from/$1" "$work/$1" ;;
    esac
  }
  fetch SHA256SUMS || { echo "install.sh: no SHA256SUMS at $from" >&2; exit 1; }
  fetch "$artifact" || { echo "install.sh: no $artifact at $from" >&2; exit 1; }
  grep -E "^[0-9a-f]{64}  $artifact\$" "$work/SHA256SUMS" > "$work/sum" \
    || { echo "install.sh: SHA256SUMS lists no $artifact" >&2; exit 1; }
  (cd "$work" && sha256sum --quiet -c sum) \
    || { echo "install.sh: $artifact does not match its checksum; nothing installed" >&2; exit 1; }
  install -m 0755 "$work/$artifact" "$prefix/bin/flotilla.new"
  mv -f "$prefix/bin/flotilla.new" "$prefix/bin/flotilla"
else
  cd "$(dirname "$0")/.."
  [ -f "$HOME/.cargo/env" ] && . "$HOME/.cargo/env"
  command -v cargo >/dev/null \
    || { echo "install.sh: no cargo; install Rust (https://rustup.rs) or use --from with a release" >&2; exit 1; }
  . scripts/toolchain.sh
  rustup target list --installed | grep -qx wasm32-wasip2 || rustup target add wasm32-wasip2
  export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/flotilla-target}"
  cargo install --locked --quiet --force --path host/flotilla --root "$prefix"
fi
"$prefix/bin/flotilla" --version >/dev/null
echo "$prefix/bin/flotilla"
case ":$PATH:" in
  *":$prefix/bin:"*) ;;
  *) echo "install.sh: $prefix/bin is not on PATH; add it, or run $prefix/bin/flotilla" >&2 ;;
esac
