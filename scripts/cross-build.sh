#!/usr/bin/env bash
# The shipped binary's release build for another target, written once here:
#
#   scripts/cross-build.sh [windows] [musl]      default: both
#
#   windows  x86_64-pc-windows-gnu (scripts/windows.sh runs it under Wine; needs
#            gcc-mingw-w64-x86-64)
#   musl     x86_64-unknown-linux-musl, static (deploy/image.sh puts it in the container
#            image; needs musl-tools)
#
# scripts/windows.sh, deploy/image.sh and scripts/release.sh call it, so each finds the binary
# up to date when another built it. scripts/test.sh starts the Windows build in the background,
# at the lowest CPU and I/O priority, while the tests build and run: the tests wait on their
# peers (sshd, dockerd, the registry, moto) most of the time and leave about 70% of the 2 cores
# idle, which this build takes. The test run builds no musl release: its tests are built for
# musl, and it packages those binaries (FLOTILLA_MUSL_DIR, deploy/image.sh).
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
[ $# -gt 0 ] || set -- windows musl
# The Windows build's profile: release, or FLOTILLA_WINDOWS_PROFILE (the test run's
# windows-check, see Cargo.toml). windows.sh and release.sh read the binary from its folder.
windows_profile="${FLOTILLA_WINDOWS_PROFILE:-release}"
for which in "$@"; do
  # The wall and CPU time of each build, for the test run's log (the builds' share of its 2
  # cores): bash's `time` counts the build's child processes. Cargo's report of each crate's
  # time goes to $CARGO_TARGET_DIR/cargo-timings/ (--timings).
  echo "== cross-build $which: start at ${SECONDS} s"
  TIMEFORMAT="== cross-build $which: %R s wall, %U s user CPU, %S s system CPU"
  time case "$which" in
    windows)
      t=x86_64-pc-windows-gnu
      rustup target list --installed | grep -qx "$t" || rustup target add "$t"
      cargo build --locked --timings --profile "$windows_profile" --target "$t" -p flotilla --bin flotilla --bin flotilla-gitlab
      ;;
    musl)
      t=x86_64-unknown-linux-musl
      rustup target list --installed | grep -qx "$t" || rustup target add "$t"
      command -v musl-gcc >/dev/null || { echo "musl-gcc is missing: apt-get install musl-tools" >&2; exit 1; }
      CC_x86_64_unknown_linux_musl=musl-gcc \
        cargo build --locked --timings --release --target "$t" -p flotilla --bin flotilla --bin flotilla-gitlab
      ;;
    *) echo "cross-build.sh: unknown target '$which' (windows or musl)" >&2; exit 2 ;;
  esac
  echo "== cross-build $which: done at ${SECONDS} s"
done
