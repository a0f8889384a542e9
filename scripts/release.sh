#!/usr/bin/env bash
# The release artifacts, into DIR (default dist/):
#   flotilla-x86_64-unknown-linux-musl   static Linux binary (symbols stripped), at most 50 MiB
#   flotilla-x86_64-pc-windows-gnu.exe   the Windows host
#   flotilla-gitlab-x86_64-unknown-linux-musl, flotilla-gitlab-x86_64-pc-windows-gnu.exe
#                                        the lean GitLab driver (static on Linux, at most
#                                        16 MiB): what the runner starts for each job stage
#   flotilla-image.tar                   the container image (`docker load -i`), when a Docker
#                                        Engine is reachable or scripts/container.sh left one
#   SHA256SUMS                           what scripts/install.sh --from checks
#   SHA256SUMS.sig                       Ed25519 signature over SHA256SUMS (openssl pkeyutl
#                                        -rawin), with the release key: the private key in
#                                        the file FLOTILLA_RELEASE_SIGNING_KEY names, whose
#                                        public half scripts/install.sh pins. Without it, a
#                                        throwaway key signs and its public half is written
#                                        as release-key.pub (install with --key release-key.pub).
# The official plugins are inside the binaries (`flotilla plugin export builtin:NAME`).
# Needs what deploy/image.sh and scripts/windows.sh need (musl-tools, gcc-mingw-w64-x86-64).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -f "$HOME/.cargo/env" ] && . "$HOME/.cargo/env"
. scripts/toolchain.sh
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/flotilla-target}"
dist="${1:-dist}"
mkdir -p "$dist"
max_bytes=$((50 * 1024 * 1024))

musl=x86_64-unknown-linux-musl
win=x86_64-pc-windows-gnu
rustup target list --installed | grep -qx wasm32-wasip2 || rustup target add wasm32-wasip2
# The static Linux binaries: the release build, or FLOTILLA_MUSL_DIR's (deploy/image.sh).
musl_bins="${FLOTILLA_MUSL_DIR:-}"
if [ -z "$musl_bins" ]; then
  ./scripts/cross-build.sh musl
  musl_bins="$CARGO_TARGET_DIR/$musl/release"
fi
./scripts/cross-build.sh windows
for bin in flotilla flotilla-gitlab; do
  strip -o "$dist/$bin-$musl" "$musl_bins/$bin"
  # The test run builds its Windows binaries in the windows-check profile (FLOTILLA_WINDOWS_PROFILE).
  x86_64-w64-mingw32-strip -o "$dist/$bin-$win.exe" "$CARGO_TARGET_DIR/$win/${FLOTILLA_WINDOWS_PROFILE:-release}/$bin.exe"
done

# The host at most 50 MiB; the driver, started seven times per job, at most 16 MiB (it carries
# no wasmtime and no server: a start maps and relocates a fraction of the host's pages).
for check in "flotilla $max_bytes" "flotilla-gitlab $((16 * 1024 * 1024))"; do
  read -r bin limit <<< "$check"
  size=$(stat -c %s "$dist/$bin-$musl")
  echo "release: $bin-$musl is $size bytes, $((size / 1024 / 1024)) MiB (limit $((limit / 1024 / 1024)) MiB)"
  [ "$size" -le "$limit" ] || { echo "release: $bin-$musl is over $limit bytes" >&2; exit 1; }
  # Static: no interpreter, nothing to resolve at load time.
  if readelf -l "$dist/$bin-$musl" | grep -q 'program interpreter'; then
    echo "release: $bin-$musl is not static" >&2; exit 1
  fi
done

if [ ! -f "$dist/flotilla-image.tar" ] && docker version >/dev/null 2>&1; then
  ./deploy/image.sh flotilla:release
  docker save flotilla:release -o "$dist/flotilla-image.tar"
fi
(cd "$dist" && sha256sum flotilla-* > SHA256SUMS)
cat "$dist/SHA256SUMS"
rm -f "$dist/release-key.pub" "$dist/SHA256SUMS.sig"
signing="${FLOTILLA_RELEASE_SIGNING_KEY:-}"
if [ -z "$signing" ]; then
  throwaway=$(mktemp -d)
  trap 'rm -rf "$throwaway"' EXIT
  signing="$throwaway/key.pem"
  openssl genpkey -algorithm ed25519 -out "$signing"
  openssl pkey -in "$signing" -pubout -out "$dist/release-key.pub"
  echo "release: no FLOTILLA_RELEASE_SIGNING_KEY, so SHA256SUMS is signed with a throwaway key; install with --key $dist/release-key.pub" >&2
fi
openssl pkeyutl -sign -inkey "$signing" -rawin -in "$dist/SHA256SUMS" -out "$dist/SHA256SUMS.sig"
echo "release: SHA256SUMS.sig written"
