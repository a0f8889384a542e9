#!/usr/bin/env bash
# The release builds of the two binaries the test run checks on other targets: Windows
# (scripts/windows.sh runs it under Wine) and static musl (deploy/image.sh puts it in the
# container image). The same commands, environment included, as those scripts run, so theirs
# find the binaries up to date.
#
# scripts/test.sh starts this in the background, at the lowest CPU and I/O priority, while the
# tests build and run: the tests wait on their peers (sshd, dockerd, the registry, moto) most
# of the time and leave about 70% of the 2 cores idle, which these builds take. Run by hand,
# it is two ordinary release builds.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -f "$HOME/.cargo/env" ] && . "$HOME/.cargo/env"
. scripts/toolchain.sh
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/flotilla-target}"
# Started in a session of its own (setsid), this build is a scheduler autogroup of its own on
# kernels with autogroups, and `nice` then only ranks processes inside it: the group as a whole
# would take half the CPU from the tests. The group's own nice value ranks it against them.
if [ "${FLOTILLA_BACKGROUND:-}" = 1 ] && [ -w /proc/self/autogroup ]; then
  echo 19 > /proc/self/autogroup || true
fi
for t in x86_64-pc-windows-gnu x86_64-unknown-linux-musl; do
  rustup target list --installed | grep -qx "$t" || rustup target add "$t"
done
cargo build --locked --release --target x86_64-pc-windows-gnu -p flotilla --bin flotilla
CC_x86_64_unknown_linux_musl=musl-gcc \
  cargo build --locked --release --target x86_64-unknown-linux-musl -p flotilla --bin flotilla
