#!/usr/bin/env bash
# Installs flotilla.
#
#   scripts/install.sh --from DIR-or-URL [--prefix DIR] [--key PUBLIC.pem | --sha256 HEX]
#       No Rust needed: takes the static Linux binaries (flotilla-x86_64-unknown-linux-musl
#       and the GitLab driver flotilla-gitlab-x86_64-unknown-linux-musl), SHA256SUMS and
#       SHA256SUMS.sig from a release directory or an https:// URL (what scripts/release.sh
#       writes), checks the signature over SHA256SUMS with the release key pinned below (or
#       --key), each binary against its checksum, and installs them as PREFIX/bin/flotilla and
#       PREFIX/bin/flotilla-gitlab. --sha256 checks the host binary against a checksum you got
#       elsewhere instead (SHA256SUMS and its signature are then not read, and the driver is
#       not installed: the runner then runs `flotilla gitlab`). http:// is refused except on
#       loopback, and a redirect may only go to https://.
#   scripts/install.sh [--prefix DIR]
#       From this checkout, with Rust (rustup): `cargo install --locked --path host/flotilla`
#       (both binaries) into PREFIX (the official plugins are built into the binary, so the wasm32-wasip2
#       target is added when missing).
#
# PREFIX defaults to /usr/local as root, ~/.local otherwise. Prints the installed path.
# Signatures are Ed25519 over the SHA256SUMS file, checked with openssl (3.0 or later).
set -euo pipefail
from="" prefix="" key="" sha256=""
while [ $# -gt 0 ]; do
  case "$1" in
    --from) from="${2:?--from needs a directory or URL}"; shift 2 ;;
    --prefix) prefix="${2:?--prefix needs a directory}"; shift 2 ;;
    --key) key="${2:?--key needs a public key file in PEM}"; shift 2 ;;
    --sha256) sha256="${2:?--sha256 needs the SHA-256 of the binary in hex}"; shift 2 ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "install.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

# The project's release key (Ed25519). Releases are signed with its private half
# (scripts/release.sh, FLOTILLA_RELEASE_SIGNING_KEY); --key names another for your own builds.
release_key='-----BEGIN PUBLIC KEY-----
MCowBQYDK2VwAyEAnAC7DcMyZwnIaF7ybPW4jr9KX3kKHyHgpGATHCGt3eA=
-----END PUBLIC KEY-----'

if [ -n "$sha256" ] && ! printf '%s' "$sha256" | grep -Eqx '[0-9a-fA-F]{64}'; then
  echo "install.sh: --sha256 takes 64 hex digits, not $sha256" >&2; exit 2
fi
if [ -n "$sha256" ] && [ -n "$key" ]; then
  echo "install.sh: --sha256 and --key are two ways to trust a binary; give one" >&2; exit 2
fi
if [ -n "$from" ]; then
  case "$from" in
    http://*@*)
      echo "install.sh: $from: a plain-HTTP URL with user information (@) is refused: it can name another host than it seems to" >&2
      exit 2 ;;
    https://*) ;;
    http://127.0.0.1[:/]*|http://127.0.0.1|http://localhost[:/]*|http://localhost|http://\[::1\]*) ;;
    http://*|ftp://*|file://*|*://*)
      echo "install.sh: $from: only https:// (or http:// on loopback, or a directory) is accepted: anyone on the path could change what plain HTTP carries" >&2
      exit 2 ;;
  esac
fi
if [ -z "$prefix" ]; then
  if [ "$(id -u)" = 0 ]; then prefix=/usr/local; else prefix="$HOME/.local"; fi
fi
artifact=flotilla-x86_64-unknown-linux-musl
driver=flotilla-gitlab-x86_64-unknown-linux-musl

if [ -n "$from" ]; then
  [ "$(uname -s)-$(uname -m)" = "Linux-x86_64" ] \
    || { echo "install.sh: the release binary is for Linux x86_64; this is $(uname -s) $(uname -m)" >&2; exit 1; }
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  fetch() {
    case "$from" in
      http://*|https://*)
        # A redirect may only lead to https://, whatever the first hop was.
        if command -v curl >/dev/null; then
          curl -fsSL --proto '=http,https' --proto-redir '=https' "$from/$1" -o "$work/$1"
        else
          case "$from" in
            https://*) wget -q --https-only "$from/$1" -O "$work/$1" ;;
            *) wget -q --max-redirect=0 "$from/$1" -O "$work/$1" ;;
          esac
        fi ;;
      *) cp "$from/$1" "$work/$1" ;;
    esac
  }
  fetch "$artifact" || { echo "install.sh: no $artifact at $from" >&2; exit 1; }
  if [ -n "$sha256" ]; then
    printf '%s  %s\n' "$(printf '%s' "$sha256" | tr 'A-F' 'a-f')" "$artifact" > "$work/sum"
  else
    command -v openssl >/dev/null \
      || { echo "install.sh: openssl is needed to check the release's signature (or give --sha256)" >&2; exit 1; }
    fetch SHA256SUMS || { echo "install.sh: no SHA256SUMS at $from" >&2; exit 1; }
    fetch SHA256SUMS.sig || { echo "install.sh: no SHA256SUMS.sig at $from: an unsigned release is not installed (give --sha256 to trust a checksum you got elsewhere)" >&2; exit 1; }
    if [ -n "$key" ]; then
      cp "$key" "$work/key.pem" || { echo "install.sh: cannot read --key $key" >&2; exit 1; }
    else
      printf '%s\n' "$release_key" > "$work/key.pem"
    fi
    openssl pkeyutl -verify -pubin -inkey "$work/key.pem" -rawin \
        -in "$work/SHA256SUMS" -sigfile "$work/SHA256SUMS.sig" >/dev/null 2>&1 \
      || { echo "install.sh: SHA256SUMS at $from is not signed by the release key${key:+ $key}; nothing installed" >&2; exit 1; }
    grep -E "^[0-9a-f]{64}  $artifact\$" "$work/SHA256SUMS" > "$work/sum" \
      || { echo "install.sh: SHA256SUMS lists no $artifact" >&2; exit 1; }
    # The driver, when the release has it (releases before it had only the host).
    if grep -E "^[0-9a-f]{64}  $driver\$" "$work/SHA256SUMS" >> "$work/sum"; then
      fetch "$driver" || { echo "install.sh: SHA256SUMS lists $driver, but $from has none" >&2; exit 1; }
    fi
  fi
  (cd "$work" && sha256sum --quiet -c sum) \
    || { echo "install.sh: a binary does not match its checksum; nothing installed" >&2; exit 1; }
  mkdir -p "$prefix/bin"
  if [ -f "$work/$driver" ]; then
    install -m 0755 "$work/$driver" "$prefix/bin/flotilla-gitlab.new"
    mv -f "$prefix/bin/flotilla-gitlab.new" "$prefix/bin/flotilla-gitlab"
  fi
  install -m 0755 "$work/$artifact" "$prefix/bin/flotilla.new"
  mv -f "$prefix/bin/flotilla.new" "$prefix/bin/flotilla"
  if [ ! -f "$work/$driver" ] && [ -e "$prefix/bin/flotilla-gitlab" ]; then
    echo "install.sh: $prefix/bin/flotilla-gitlab is from an earlier install and was not replaced (this install checked the host alone); the runner keeps running it" >&2
  fi
else
  [ -z "$key$sha256" ] || { echo "install.sh: --key and --sha256 go with --from" >&2; exit 2; }
  mkdir -p "$prefix/bin"
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
if [ -x "$prefix/bin/flotilla-gitlab" ]; then
  "$prefix/bin/flotilla-gitlab" --version >/dev/null
  echo "$prefix/bin/flotilla-gitlab"
fi
case ":$PATH:" in
  *":$prefix/bin:"*) ;;
  *) echo "install.sh: $prefix/bin is not on PATH; add it, or run $prefix/bin/flotilla" >&2 ;;
esac
