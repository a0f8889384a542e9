#!/usr/bin/env bash
# Runs the runtime benchmarks and prints the medians (from criterion's estimates) and ratios.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -f "$HOME/.cargo/env" ] && . "$HOME/.cargo/env"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/flotilla-target}"
rustup target list --installed | grep -qx wasm32-wasip2 || rustup target add wasm32-wasip2
out=$(mktemp -d)
# The connector benchmark's "machines" are local sshd daemons that run commands as root through
# bash, which reads root's ~/.bashrc for every command over SSH. On a workstation that file can
# cost more than the whole check (pyenv init: ~100 ms of CPU each), so it is masked in a private
# mount namespace when we can make one; the figures then measure the connector, not the shell.
if [ -z "${FLOTILLA_BENCH_NS:-}" ] && [ -f /root/.bashrc ] && [ "$(id -u)" = 0 ] && command -v unshare >/dev/null; then
  exec env FLOTILLA_BENCH_NS=1 unshare --mount --propagation private -- bash -c 'mount --bind /dev/null /root/.bashrc && exec "$0" "$@"' "$0" "$@"
fi
# Each bench lives in the crate it measures; cargo runs the named ones of the packages given.
FLOTILLA_BENCH_OUT="$out" cargo bench --locked \
  -p flotilla-plugin-runtime -p flotilla-scaler -p flotilla-cloud-suites \
  -p flotilla-connector -p flotilla -p flotilla-credentials \
  --bench runtime --bench scaler --bench aws --bench oci --bench connector --bench gitlab \
  --bench instance --bench credentials -- "$@"
python3 - "$CARGO_TARGET_DIR/criterion" "$out" <<'PY'
import json, os, sys
root, out = sys.argv[1], sys.argv[2]
def median(name):
    p = os.path.join(root, *name.split("/"), "new", "estimates.json")
    try:
        return json.load(open(p))["median"]["point_estimate"]
    except OSError:
        return None
def fmt(ns):
    if ns is None: return "n/a"
    for unit, div in (("s", 1e9), ("ms", 1e6), ("µs", 1e3)):
        if ns >= div: return f"{ns/div:.3g} {unit}"
    return f"{ns:.3g} ns"
rows = ["scaler/acquire_release_10k_x4", "scaler/reconcile_tick_10k", "scaler/reservation_to_increase",
        "static/trivial_call", "static/instantiate", "template/instantiate", "static/load_from_cache",
        "template/load_from_cache", "static/first_compile", "template/first_compile",
        "http_get/guest_update", "http_get/guest_update_denied", "http_get/reqwest_fresh_connection", "http_get/reqwest_pooled",
        "aws_update_100/plugin", "aws_update_100/host_reqwest_sigv4",
        "oci_start/file_baseline", "oci_start/cached_if_not_present", "oci_start/cached_if_not_present_verified",
        "oci_start/always_resolve_tag", "oci_start/always_resolve_tag_verified", "oci_start/reqwest_manifest_get",
        "oci_start/cold_pull_template",
        "connector/ready_one", "connector/ready_twenty_concurrently",
        "connector/acquire_release_ssh_ready", "connector/acquire_release_always_ready",
        "connector/ping_one_kept_session", "connector/ping_twenty_kept_sessions_concurrently",
        "gitlab/lifecycle_direct", "gitlab/lifecycle_through_handle", "gitlab/prepare_to_first_output",
        "gitlab/stage_attached_exec", "gitlab/stage_detached_followed",
        "instance/ssh_host_true", "instance/prepare_to_first_byte"]
print("\nmedians:")
for r in rows: print(f"  {r:<38} {fmt(median(r))}")
try: print(f"  {'rss_per_instance':<38} {open(os.path.join(out,'rss_per_instance_kib')).read()} KiB")
except OSError: pass
try: print(f"  {'http_get interleaved one by one':<38} {open(os.path.join(out,'http_get_interleaved')).read()}")
except OSError: pass
try: print(f"  {'http_get interleaved in blocks of 20':<38} {open(os.path.join(out,'http_get_interleaved_blocks')).read()}")
except OSError: pass
try: print(f"  {'http_get cpu per GET':<38} {open(os.path.join(out,'http_get_cpu')).read()}")
except OSError: pass
for kind, label in (("interleaved", "one by one"), ("interleaved_blocks", "in blocks of 20"), ("cpu", "cpu per GET")):
    try: print(f"  {'http_get one worker, ' + label:<38} {open(os.path.join(out, 'http_get_' + kind + '_one_worker')).read()}")
    except OSError: pass
g, f, p = median("http_get/guest_update"), median("http_get/reqwest_fresh_connection"), median("http_get/reqwest_pooled")
if g and f: print(f"  guest GET / reqwest (fresh connection)  {g/f:.2f}x")
if g and p: print(f"  guest GET / reqwest (pooled)            {g/p:.2f}x")
w, h = median("aws_update_100/plugin"), median("aws_update_100/host_reqwest_sigv4")
if w and h: print(f"  AWS update(100) plugin / host reqwest   {w/h:.2f}x")
base = median("oci_start/file_baseline")
for r in ("cached_if_not_present", "cached_if_not_present_verified", "always_resolve_tag", "always_resolve_tag_verified"):
    m = median("oci_start/" + r)
    if base and m: print(f"  oci start {r:<31} / file {m/base:.2f}x")
t, q = median("oci_start/always_resolve_tag"), median("oci_start/reqwest_manifest_get")
if t and q and base: print(f"  oci always / (file + one manifest GET)  {t/(base+q):.2f}x")
o, t = median("connector/ready_one"), median("connector/ready_twenty_concurrently")
if o and t: print(f"  readiness of 20 at once / one           {t/o:.2f}x")
o, t = median("connector/ping_one_kept_session"), median("connector/ping_twenty_kept_sessions_concurrently")
if o and t: print(f"  ping of 20 kept sessions / one          {t/o:.2f}x")
r, n = median("connector/acquire_release_ssh_ready"), median("connector/acquire_release_always_ready")
if r and n: print(f"  acquire on a ready instance, SSH - none {fmt(r-n)}")
d, h = median("gitlab/lifecycle_direct"), median("gitlab/lifecycle_through_handle")
if d and h: print(f"  container lifecycle via handle / direct {h/d:.2f}x")
a, f = median("gitlab/stage_attached_exec"), median("gitlab/stage_detached_followed")
if a and f: print(f"  run stage detached+followed / attached  {f/a:.2f}x")
s_, p_ = median("instance/ssh_host_true"), median("instance/prepare_to_first_byte")
if s_ and p_: print(f"  instance prepare to first byte / ssh true {p_/s_:.2f}x (goal 1.2x or less)")
a = median("scaler/acquire_release_10k_x4")
if a: print(f"  acquire+release per second (one core)  {1e9/a:,.0f}")
PY
