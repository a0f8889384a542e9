#!/usr/bin/env bash
# Checks the release artifacts in DIR the way a user without Rust meets them: installs with
# `scripts/install.sh --from` (a directory, then a URL served on loopback) in an environment
# without cargo, runs the installed binary on the quick start, and makes sure a tampered
# binary is refused with nothing installed: one that does not match SHA256SUMS, one whose
# SHA256SUMS was rewritten to match but no longer carries the release signature, a release
# without a signature, a wrong --sha256 and a plain-HTTP URL off loopback.
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

# A release built without the project's signing key says which key signed it.
key=()
[ -f "$dist/release-key.pub" ] && key=(--key "$dist/release-key.pub")
installed=$(bare ./scripts/install.sh --from "$dist" --prefix "$work/a" "${key[@]}" 2>/dev/null)
bin=$(head -1 <<< "$installed")
[ "$bin" = "$work/a/bin/flotilla" ] || { echo "install-check: installed at $bin" >&2; exit 1; }
[ "$(sed -n 2p <<< "$installed")" = "$work/a/bin/flotilla-gitlab" ] \
  || { echo "install-check: no driver installed: $installed" >&2; exit 1; }
cmp "$work/a/bin/flotilla-gitlab" "$dist/flotilla-gitlab-x86_64-unknown-linux-musl"
bare "$bin" --version
bare "$work/a/bin/flotilla-gitlab" --pool p --limit 4 snippet > "$work/snippet.toml"
grep -q "config_exec = \"$work/a/bin/flotilla-gitlab\"" "$work/snippet.toml" \
  || { echo "install-check: the installed driver's snippet does not name it:" >&2; cat "$work/snippet.toml" >&2; exit 1; }
bare "$bin" plugin ls | grep -q '^builtin:aws ' || { echo "install-check: no built-in plugins" >&2; exit 1; }
bare "$bin" config check -c examples/quickstart.toml

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
python3 -m http.server --bind 127.0.0.1 --directory "$dist" "$port" >/dev/null 2>&1 &
server=$!
for _ in $(seq 1 50); do curl -sf "http://127.0.0.1:$port/SHA256SUMS" >/dev/null && break; sleep 0.1; done
bin=$(bare ./scripts/install.sh --from "http://127.0.0.1:$port" --prefix "$work/b" "${key[@]}" 2>/dev/null | sed -n 1p)
cmp "$bin" "$dist/flotilla-x86_64-unknown-linux-musl"
cmp "$work/b/bin/flotilla-gitlab" "$dist/flotilla-gitlab-x86_64-unknown-linux-musl"

# refused NAME EXPECTED-WORDS ARGS...: install.sh fails, says so, and installs nothing.
refused() {
  local name=$1 words=$2; shift 2
  if bare ./scripts/install.sh --prefix "$work/$name" "$@" 2> "$work/$name.txt"; then
    echo "install-check: $name: installed" >&2; exit 1
  fi
  grep -q "$words" "$work/$name.txt" || { echo "install-check: $name:" >&2; cat "$work/$name.txt" >&2; exit 1; }
  [ ! -e "$work/$name/bin" ] || { echo "install-check: $name: something was installed" >&2; exit 1; }
}
binary=flotilla-x86_64-unknown-linux-musl
driver=flotilla-gitlab-x86_64-unknown-linux-musl
# A tampered driver keeps the host out too.
mkdir -p "$work/bad-driver"
cp "$dist/SHA256SUMS" "$dist/SHA256SUMS.sig" "$dist/$binary" "$dist/$driver" "$work/bad-driver/"
printf 'x' >> "$work/bad-driver/$driver"
refused tampered-driver "does not match its checksum" --from "$work/bad-driver" "${key[@]}"
mkdir -p "$work/bad"
cp "$dist/SHA256SUMS" "$dist/SHA256SUMS.sig" "$dist/$binary" "$dist/$driver" "$work/bad/"
printf 'x' >> "$work/bad/$binary"
refused tampered "does not match its checksum" --from "$work/bad" "${key[@]}"
# The attacker rewrites SHA256SUMS to match; the signature no longer does.
(cd "$work/bad" && sha256sum "$binary" "$driver" > SHA256SUMS)
refused resummed "not signed by the release key" --from "$work/bad" "${key[@]}"
# Without --key, a release signed by another key is refused the same way.
[ ${#key[@]} -eq 0 ] || refused other-key "not signed by the release key" --from "$dist"
rm "$work/bad/SHA256SUMS.sig"
refused unsigned "an unsigned release is not installed" --from "$work/bad" "${key[@]}"
refused wrong-sum "does not match its checksum" --from "$dist" --sha256 "$(sha256sum "$work/bad/$binary" | cut -c1-64)"
refused plain-http "only https://" --from "http://192.0.2.1:$port"
refused userinfo "user information" --from "http://127.0.0.1:$port@192.0.2.1"
# A checksum from elsewhere works without SHA256SUMS or a signature.
mkdir -p "$work/bare-binary"
cp "$dist/$binary" "$work/bare-binary/"
bin=$(bare ./scripts/install.sh --from "$work/bare-binary" --prefix "$work/d" --sha256 "$(sha256sum "$dist/$binary" | cut -c1-64)" 2>/dev/null | sed -n 1p)
cmp "$bin" "$dist/$binary"
[ ! -e "$work/d/bin/flotilla-gitlab" ] || { echo "install-check: --sha256 installed a driver it did not check" >&2; exit 1; }
echo "install-check: installed from a directory, a URL and a --sha256 without Rust; refused a tampered host or driver, a re-summed one, an unsigned release, a wrong checksum and plain HTTP"
