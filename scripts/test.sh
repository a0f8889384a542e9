#!/usr/bin/env bash
# The whole test suite: formatting, lints (host and guests), then every test. CI runs this.
#
#   ./scripts/test.sh                  the full run
#   ./scripts/test.sh --quick [REV]    the developer's loop: formatting, clippy, and the tests of
#                                      the crates (and the binary's test files) changed since REV
#                                      (default HEAD: the uncommitted change), nothing else
set -euo pipefail
cd "$(dirname "$0")/.."
quick=""
if [ "${1:-}" = "--quick" ]; then
  quick="${2:-HEAD}"
fi
[ -f "$HOME/.cargo/env" ] && . "$HOME/.cargo/env"
. scripts/toolchain.sh
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/flotilla-target}"

rustup target list --installed | grep -qx wasm32-wasip2 || rustup target add wasm32-wasip2
# The full run builds and runs the tests for x86_64-unknown-linux-musl, the target of the
# shipped Linux binary (the release's static binaries and the container image): the tests run
# the static binary, and the checks after them package that same binary instead of building
# the host once more for musl (that release build was 1,080 of a fresh run's 3,840 CPU-s).
# ring's C code needs musl-gcc (musl-tools, below). The quick loop keeps the machine's target.
linux_target=x86_64-unknown-linux-musl
rustup target list --installed | grep -qx "$linux_target" || rustup target add "$linux_target"
export CC_x86_64_unknown_linux_musl=musl-gcc
# rustc links the glibc target with the toolchain's own lld (Rust 1.90 on), but the musl target
# with the system's `cc` and so GNU ld. The test build links about 50 binaries (tests, benches,
# examples), each with wasmtime in it, so musl's links get the same lld, passed as rustc passes
# it for glibc: `-fuse-ld=lld` and the toolchain's gcc-ld directory. A bench's link: 1.8 s with
# GNU ld, 0.4 s with lld. Only this target's crates see these flags (not build scripts).
host_triple="$(rustc -vV | sed -n 's/^host: //p')"
export CARGO_TARGET_X86_64_UNKNOWN_LINUX_MUSL_RUSTFLAGS="-C link-arg=-fuse-ld=lld -C link-arg=-B$(rustc --print sysroot)/lib/rustlib/$host_triple/bin/gcc-ld"
rustup component list --installed | grep -q '^clippy' || rustup component add clippy
rustup component list --installed | grep -q '^rustfmt' || rustup component add rustfmt

# Debian packages the tests run against:
#   prometheus      promtool lints the /metrics output, and a real server discovers the
#                   machines through /sd/prometheus (prometheus-node-exporter on them);
#   docker-registry the CNCF distribution registry for the OCI tests (htpasswd: apache2-utils);
#   bsdutils        `script`, a pseudo-terminal for the progress-bar test;
#   openssh-server  loopback sshd daemons as the connector's machines (started by the tests);
#   docker.io       a real Docker Engine the connector reaches through those machines' SSH sessions;
#   busybox-static  the one binary of the test image (no image registry is reachable, so the
#                   tests import a FROM-scratch rootfs into the engine);
#   gcc-mingw-w64-x86-64, wine64
#                   the Windows host: C dependencies of the x86_64-pc-windows-gnu cross-build,
#                   and Wine to run flotilla.exe (scripts/windows.sh);
#   nodejs, npm     componentize-js builds the JavaScript plugin template (scripts/templates.sh);
#                   componentize-py, for the Python one, comes from PyPI into a venv
#   musl-tools, ca-certificates
#                   the static binary of the container image (deploy/image.sh) and its CA roots;
#   iproute2        `ip netns`: a dockerd with its iptables rules on, in a network namespace of
#                   its own (job network isolation), entered with util-linux's nsenter;
#   curl, openssl   the runner-cache store tests drive the stores as the helper does (curl) and
#                   make the GCS stand-in's service-account RSA key (openssl).
# Some tests need root: that dockerd, and stand-ins served on port 443 of 127.0.0.N.
need=()
command -v promtool >/dev/null || need+=(prometheus)
command -v prometheus-node-exporter >/dev/null || need+=(prometheus-node-exporter)
command -v docker-registry >/dev/null || need+=(docker-registry)
command -v htpasswd >/dev/null || need+=(apache2-utils)
command -v script >/dev/null || need+=(bsdutils)
[ -x /usr/sbin/sshd ] || need+=(openssh-server)
command -v dockerd >/dev/null || need+=(docker.io containerd runc)
[ -x /bin/busybox ] || need+=(busybox-static)
command -v x86_64-w64-mingw32-gcc >/dev/null || need+=(gcc-mingw-w64-x86-64)
[ -x /usr/lib/wine/wine64 ] || need+=(wine64)
command -v musl-gcc >/dev/null || need+=(musl-tools)
command -v node >/dev/null || need+=(nodejs)
command -v npm >/dev/null || need+=(npm)
[ -s /etc/ssl/certs/ca-certificates.crt ] || need+=(ca-certificates)
command -v ip >/dev/null || need+=(iproute2)
command -v curl >/dev/null || need+=(curl)
command -v openssl >/dev/null || need+=(openssl)
if [ ${#need[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo apt-get update -qq
  # RUNLEVEL=1 keeps the packages from starting system services (no sshd on port 22).
  $sudo env DEBIAN_FRONTEND=noninteractive RUNLEVEL=1 apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# moto (with boto3) is the AWS peer of the AWS plugin's tests.
export FLOTILLA_VENV="${FLOTILLA_VENV:-$HOME/.cache/flotilla-venv}"
if [ ! -x "$FLOTILLA_VENV/bin/moto_server" ]; then
  if ! python3 -m venv "$FLOTILLA_VENV"; then
    # Debian's system python needs python3-venv for ensurepip.
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
    python3 -m venv "$FLOTILLA_VENV"
  fi
  "$FLOTILLA_VENV/bin/pip" install -q "moto[server]" boto3
fi
# deploy/check.py: helm-sdkpy (Helm 4's library; its wheel says Python >= 3.12, but it is cffi
# over a Go library and runs on Debian 12's 3.11), PyYAML, and kubernetes-validate.
"$FLOTILLA_VENV/bin/python" -c "import helm_sdkpy, yaml, kubernetes_validate" 2>/dev/null \
  || "$FLOTILLA_VENV/bin/pip" install -q --ignore-requires-python "helm-sdkpy==0.1.32" "pyyaml==6.0.3" "kubernetes-validate==1.37.0"
# kubectl renders the kustomize manifests offline (`kubectl kustomize`).
if ! command -v kubectl >/dev/null; then
  sudo=""
  [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends kubernetes-client >/dev/null
fi
# oras-py is the independent OCI client of the cross-checks.
"$FLOTILLA_VENV/bin/python" -c "import oras" 2>/dev/null || "$FLOTILLA_VENV/bin/pip" install -q "oras==0.2.43"
# Azurite is the Azure Blob store of the runner-cache tests (tests/peers/src/cache_stores).
export FLOTILLA_NPM="${FLOTILLA_NPM:-$HOME/.cache/flotilla-npm}"
[ -x "$FLOTILLA_NPM/node_modules/.bin/azurite-blob" ] \
  || npm install --prefix "$FLOTILLA_NPM" --no-audit --no-fund --silent "azurite@3.35.0"

# Each phase says when it starts, in seconds since the script started (set-up included).
phase() { echo "== $* (at ${SECONDS} s)"; }

# The Windows build goes in the background at the lowest CPU and I/O priority
# (scripts/cross-build.sh), from the start: clippy's and the test build's serial stretches and
# the tests' waits on their peers leave part of the CPU idle, and this build takes it. The
# check that uses the binary waits for it further down.
cross_log="$CARGO_TARGET_DIR/cross-build.log"
# The Windows binary this run checks under Wine is built without optimisation (Cargo.toml's
# windows-check profile): the same code in a quarter of the CPU time of opt-level 1.
export FLOTILLA_WINDOWS_PROFILE=windows-check
mkdir -p "$CARGO_TARGET_DIR" # a fresh machine has none yet
# Jobs in the background, each its own process group (setsid), so a run that stops early
# leaves none behind.
background=()
trap 'for g in "${background[@]}"; do kill -- -"$g" 2>/dev/null || true; done' EXIT
if [ -z "$quick" ]; then
  phase "the Windows build, in the background (log: $cross_log)"
  FLOTILLA_BACKGROUND=1 setsid nice -n 19 ionice -t -c 3 ./scripts/cross-build.sh windows > "$cross_log" 2>&1 &
  cross=$!
  background+=("$cross")
fi
# joined PID NAME LOG: waits for a background job; its failure ends the run, with its log.
joined() {
  local waiting=$SECONDS
  if ! wait "$1"; then
    echo "$2, in the background, failed:" >&2
    tail -50 "$3" >&2
    exit 1
  fi
  echo "== $2: done ($((SECONDS - waiting)) s waited for it)"
}

phase "cargo fmt --check"
cargo fmt --all -- --check

# The guest components (plugins, the template, hostile test guests), from their manifests.
read -r -a guests <<< "$(./scripts/guests.sh)"

# Clippy on the host crates. `cargo clippy` is cargo with clippy-driver as the rustc of the
# workspace's crates (RUSTC_WORKSPACE_WRAPPER; its arguments, `-D warnings`, in CLIPPY_ARGS)
# and in check mode, which checks every dependency once more without building it. The full
# run builds with the same wrapper instead (`linted` below): clippy-driver compiles the
# workspace's crates and denies the same lints while the test build compiles them, and no
# pass over the dependencies is added (289 s of a fresh run on 2 cores; the lints add about
# 70 s to the build). The quick run, which builds only what changed, keeps `cargo clippy`.
linted() {
  RUSTC_WORKSPACE_WRAPPER="$(rustup which clippy-driver)" \
    CLIPPY_ARGS="-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__" "$@"
}

phase "clippy (guests, wasm32-wasip2)"
cargo clippy --locked --target wasm32-wasip2 "${guests[@]}" -- -D warnings

if [ -n "$quick" ]; then
  phase "clippy (host crates)"
  # In the test run's profile, so the proc macros and build scripts it compiles are the ones
  # the test build uses.
  cargo clippy --locked --profile test-run --all-targets -- -D warnings
  exec ./scripts/quick.sh "$quick"
fi

phase "guests (wasm32-wasip2)"
# tests/artifacts builds these too, but cargo may skip its build script when another checkout
# last used this target directory; building here keeps the guests in step with these sources.
cargo build --locked --profile guest --target wasm32-wasip2 --target-dir "$CARGO_TARGET_DIR/wasm-guests" "${guests[@]}"

phase "the test build, with clippy's lints (host crates, every target)"
# The test-run profile: release, but the binary crate at opt-level 1 (Cargo.toml says why),
# for $linux_target (above). Every target cargo tests by default but the doc tests: no crate
# has one (the API docs' code blocks are text), and rustdoc's pass over the 19 library crates
# to find none took a minute.
# `--tests` is every target whose manifest says `test` (libraries, binaries with tests,
# integration tests); `--examples` builds the examples, as the default run does. The benches
# are built too (in test mode, not run), so clippy sees every target `--all-targets` names.
# `--timings` leaves the build's report (each crate's time, its frontend and codegen) in
# $CARGO_TARGET_DIR/cargo-timings/, for whoever makes the next run faster.
linted cargo test --locked --profile test-run --target "$linux_target" --tests --examples --benches --no-run --timings

# The binaries the tests run (`flotilla`, `flotilla-gitlab`): the checks below use them, and
# the container image and the release artifacts are made of them (deploy/image.sh).
export FLOTILLA_MUSL_DIR="$CARGO_TARGET_DIR/$linux_target/test-run"

# The plugin templates go in the background while the tests run, at the lowest priority: the
# tests mostly wait on their peers (the flotilla binary's, at 4 threads, used 0.84 of the 2
# cores), and the templates' builds (cargo, componentize-py, componentize-js) took 89 s after
# them.
templates_log="$CARGO_TARGET_DIR/templates.log"
phase "the plugin templates (Rust, Python, JavaScript): plugin new, build, plugin test --provision; in the background (log: $templates_log)"
setsid nice -n 19 ionice -t -c 3 ./scripts/templates.sh > "$templates_log" 2>&1 &
templates=$!
background+=("$templates")

phase "tests"
# The same wrapper, so cargo finds the build above up to date.
# Three test threads on 2 cores: the tests mostly wait on their peers, and those that start a
# dockerd take turns (`DOCKER` in host/flotilla/tests/all/common/fleet.rs), so that chain is
# the phase's floor. The flotilla binary's tests took 444 s at 2 threads, 391 s at 3 and 365 s
# at 4 (each test slower, waiting for the others). The bystander tests, which compare a pool's
# latency with and without a hostile neighbour, run on their own afterwards, once the
# templates are done too: other tests' load between their two measurements failed one of them
# at 4 threads. `--test all` runs every crate's `tests/all` binary; only flotilla's has them.
linted cargo test --locked --profile test-run --target "$linux_target" --tests --examples \
  -- --test-threads 3 --skip bystander::
joined "$templates" "the plugin templates" "$templates_log"
grep '^== ' "$templates_log" || true
linted cargo test --locked --profile test-run --target "$linux_target" --test all -- bystander::

phase "deploy/: Helm chart (lint --strict, schema, package), kustomize (kubernetes-validate 1.30 and 1.33), rendered configs"
PATH="$FLOTILLA_VENV/bin:$PATH" "$FLOTILLA_VENV/bin/python" deploy/check.py "$FLOTILLA_MUSL_DIR/flotilla"

joined "$cross" "the Windows build" "$cross_log"
grep '^== cross-build' "$cross_log" || true
phase "the host on Windows (cross-built, run under Wine)"
./scripts/windows.sh

phase "the container image (static musl binary on scratch) under a real Docker Engine"
dist="$CARGO_TARGET_DIR/dist"
rm -rf "$dist"
FLOTILLA_DIST="$dist" ./scripts/container.sh

phase "release artifacts, and installing from them without Rust"
./scripts/release.sh "$dist"
./scripts/install-check.sh "$dist"
phase "done"
