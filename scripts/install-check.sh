#!/usr/bin/env bash
# Checks the release artifacts in DIR the way a user without Rust meets them: installs with
# `scripts/install.sh --from` (a directory, then a URL served on loopback) in an environment
# without cargo, runs the installed binary on the quick start, and makes sure a tampered
# binary is refused with nothing installed.
set -euo pipefail
cd "$(dirname "$0")/.."
dist="$(cd "${1:?usage: install-check.sh DIST}" && pwd)"
work=$(mktemp -d)
server=""
cleanup() { [ -n "$server" ] && kill "$server" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
bare() { env -i PATH=/usr/bin:/bin HOME="$work/home" "$@"; }
mkdir -p "$work/home"
bare sh -c 'command -v cargo' >/dev/null && { echo "install-check: cargo is on the bare PATH" >&2; exit 1; }

bin=$(bare ./scripts/install.sh --from "$dist" --prefix "$work/a" 2>/dev/null | tail -1)
[ "$bin" = "$work/a/bin/flotilla" ] || { echo "install-check: installed at $bin" >&2; exit 1; }
bare "$bin" --version
bare "$bin" plugin ls | grep -q '^builtin:aws ' || { echo "install-check: no built-in plugins" >&2; exit 1; }
bare "$bin" config check -c examples/quickstart.toml

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
python3 -m http.server --bind 127.0.0.1 --directory "$dist" "$port" >/dev/null 2>&1 &
server=$!
for _ in $(seq 1 50); do curl -sf "http://127.0.0.1:$port/SHA256SUMS" >/dev/null && break; sleep 0.1; done
bin=$(bare ./scripts/install.sh --from "http://127.0.0.1:$port" --prefix "$work/b" 2>/dev/null | tail -1)
cmp "$bin" "$dist/flotilla-x86_64-unknown-linux-musl"

mkdir -p "$work/bad"
cp "$dist/SHA256SUMS" "$work/bad/"
cp "$dist/flotilla-x86_64-unknown-linux-musl" "$work/bad/"
printf 'x' >> "$work/bad/flotilla-x86_64-unknown-linux-musl"
if bare ./scripts/install.sh --from "$work/bad" --prefix "$work/c" 2> "$work/bad.txt"; then
  echo "install-check: a tampered binary was installed" >&2; exit 1
fi
grep -q "does not match its checksum" "$work/bad.txt" || { cat "$work/bad.txt" >&2; exit 1; }
[ ! -e "$work/c/bin/flotilla" ] || { echo "install-check: something was installed" >&2; exit 1; }
echo "install-check: installed from a directory and a URL without Rust; a tampered binary was refused"
