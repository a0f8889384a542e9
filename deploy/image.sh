#!/usr/bin/env bash
# Builds the flotilla container image: the static x86_64-unknown-linux-musl binaries on `scratch`.
# Nothing is pulled (no base image), so this works offline; with internet it is the same.
#
#   deploy/image.sh [TAG]        default TAG: flotilla:<crate version>
#
# Needs Rust (rustup), Debian's musl-tools (musl-gcc, for ring's C code),
# ca-certificates, and a docker CLI whose daemon builds the image ($DOCKER_HOST is honoured).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -f "$HOME/.cargo/env" ] && . "$HOME/.cargo/env"
. scripts/toolchain.sh
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/flotilla-target}"
target=x86_64-unknown-linux-musl
version=$(sed -n 's/^version = "\(.*\)"/\1/p' host/flotilla/Cargo.toml | head -1)
tag="${1:-flotilla:$version}"

roots=/etc/ssl/certs/ca-certificates.crt
[ -s "$roots" ] || { echo "$roots is missing: apt-get install ca-certificates" >&2; exit 1; }

# The binaries: the release build, or those in FLOTILLA_MUSL_DIR when it is set (the test run
# sets it to its own musl build, the binaries its tests ran).
bins="${FLOTILLA_MUSL_DIR:-}"
if [ -z "$bins" ]; then
  ./scripts/cross-build.sh musl
  bins="$CARGO_TARGET_DIR/$target/release"
fi

ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
strip -o "$ctx/flotilla" "$bins/flotilla"
strip -o "$ctx/flotilla-gitlab" "$bins/flotilla-gitlab"
mkdir -p "$ctx/rootfs/etc/ssl/certs" "$ctx/rootfs-writable/var/cache/flotilla" \
  "$ctx/rootfs-writable/var/lib/flotilla"
cp "$roots" "$ctx/rootfs/etc/ssl/certs/ca-certificates.crt"
printf 'root:x:0:0:root:/:/sbin/nologin\nflotilla:x:65532:65532:flotilla:/var/lib/flotilla:/sbin/nologin\n' \
  > "$ctx/rootfs/etc/passwd"
printf 'root:x:0:\nflotilla:x:65532:\n' > "$ctx/rootfs/etc/group"
cp deploy/Dockerfile "$ctx/Dockerfile"
docker build --quiet --tag "$tag" "$ctx" >/dev/null
echo "built $tag ($(docker image inspect --format '{{.Size}}' "$tag") bytes)"
