#!/usr/bin/env bash
# The container image, checked against a real Docker Engine: builds it with deploy/image.sh,
# runs it with the quick-start config on a read-only root filesystem (cache and state are
# volumes), waits for /readyz, reserves and acquires a lease through the published port,
# sends SIGTERM while the lease is held (the container must keep draining and refuse new
# work), releases the lease, and expects exit 0 well inside the grace period. A second run on
# the same volumes must load the plugin from the compile cache. The lean driver is in the image.
# Needs docker.io (dockerd) and musl-tools. With FLOTILLA_DIST set, the image is also saved
# there as flotilla-image.tar (tagged flotilla:<version>) for scripts/release.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/flotilla-target}"
work=$(mktemp -d)
chmod 755 "$work"
fail() { echo "container: $*" >&2; docker logs flotilla-under-test 2>&1 | tail -20 >&2 || true; exit 1; }

# A private Docker Engine (its own socket, data and exec roots), with the default bridge so
# that ports are published as users publish them.
mkdir -p "$work/docker"
dockerd -H "unix://$work/docker/docker.sock" --data-root "$work/docker/data" \
  --exec-root "$work/docker/exec" --pidfile "$work/docker/dockerd.pid" \
  > "$work/docker/dockerd.log" 2>&1 &
export DOCKER_HOST="unix://$work/docker/docker.sock"
cleanup() {
  docker rm -f flotilla-under-test > /dev/null 2>&1 || true
  if [ -f "$work/docker/dockerd.pid" ]; then
    pid=$(cat "$work/docker/dockerd.pid")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  fi
  rm -rf "$work" 2>/dev/null || true
}
trap cleanup EXIT
for _ in $(seq 1 100); do docker version > /dev/null 2>&1 && break; sleep 0.2; done
docker version > /dev/null 2>&1 || { cat "$work/docker/dockerd.log"; exit 1; }

tag=flotilla:under-test
./deploy/image.sh "$tag"
size=$(docker image inspect --format '{{.Size}}' "$tag")
# The release's image artifact (scripts/release.sh collects it).
if [ -n "${FLOTILLA_DIST:-}" ]; then
  mkdir -p "$FLOTILLA_DIST"
  version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
  docker tag "$tag" "flotilla:$version"
  docker save "flotilla:$version" -o "$FLOTILLA_DIST/flotilla-image.tar"
fi
echo "== container: image size $size bytes ($((size / 1024 / 1024)) MiB)"

# The image's promises: a non-root user, no shell, CA roots inside.
[ "$(docker image inspect --format '{{.Config.User}}' "$tag")" = "65532:65532" ] || fail "the image does not run as 65532"
if docker run --rm --entrypoint /bin/sh "$tag" -c true > /dev/null 2>&1; then fail "the image has a shell"; fi
cid=$(docker create "$tag")
docker cp "$cid:/etc/ssl/certs/ca-certificates.crt" "$work/roots.crt"
docker rm "$cid" > /dev/null
grep -q "BEGIN CERTIFICATE" "$work/roots.crt" || fail "no CA roots in the image"
# The lean GitLab driver, for a runner manager's image to copy.
driver=$(docker run --rm --entrypoint /usr/local/bin/flotilla-gitlab "$tag" --version) || true
[[ "$driver" == "flotilla-gitlab "* ]] || fail "no flotilla-gitlab in the image: $driver"

# The quick-start config, listening on all interfaces inside the container, with the
# metrics-and-health listener on its own port.
mkdir -p "$work/etc"
sed -e 's/127.0.0.1:8080/0.0.0.0:8080/' \
  -e 's/^shutdown_grace = .*/shutdown_grace = "20s"\nmetrics_listen = "0.0.0.0:9090"/' \
  examples/quickstart.toml > "$work/etc/config.toml"
chmod -R a+rX "$work/etc"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
api_port=$(free_port)
metrics_port=$(free_port)
docker volume create flotilla-cache > /dev/null
docker volume create flotilla-state > /dev/null
start() {
  docker run -d --name flotilla-under-test --read-only --cap-drop ALL \
    --security-opt no-new-privileges \
    -v "$work/etc:/etc/flotilla:ro" -v flotilla-cache:/var/cache/flotilla \
    -v flotilla-state:/var/lib/flotilla \
    -p "127.0.0.1:$api_port:8080" -p "127.0.0.1:$metrics_port:9090" "$tag" > /dev/null
  for _ in $(seq 1 150); do
    curl -sf "127.0.0.1:$metrics_port/readyz" > /dev/null && return 0
    sleep 0.2
  done
  fail "not ready within 30 s"
}
api="http://127.0.0.1:$api_port"
auth="Authorization: Bearer quickstart-token"

echo "== container: run, ready, lease acquired through the published port"
start
# Read the whole page before matching: `curl | grep -q` under pipefail fails when grep stops
# reading early. The gauge may trail /readyz by a scrape, so look for up to 10 s.
ready_metric=no
for _ in $(seq 1 50); do
  metrics=$(curl -sf "127.0.0.1:$metrics_port/metrics" || true)
  if grep -q '^flotilla_pool_state{pool="local",state="ready"} 1' <<< "$metrics"; then
    ready_metric=yes
    break
  fi
  sleep 0.2
done
[ "$ready_metric" = yes ] || fail "no ready pool in /metrics"
# The metrics listener never serves the lease API.
code=$(curl -s -o /dev/null -w '%{http_code}' -H "$auth" "127.0.0.1:$metrics_port/v1/pools")
[ "$code" = 404 ] || fail "the metrics port answered /v1/pools with $code"
id=$(curl -sf -X POST -H "$auth" "$api/v1/pools/local/leases" | python3 -c 'import json,sys; print(json.load(sys.stdin)["lease"]["id"])')
curl -sf -X POST -H "$auth" "$api/v1/pools/local/leases/$id/acquire" > "$work/acquire.json"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["instance"], d' "$work/acquire.json"

echo "== container: SIGTERM with the lease held drains, then exits 0 once it is released"
docker kill --signal TERM flotilla-under-test > /dev/null
sent=$(date +%s.%N)
sleep 2
[ "$(docker inspect --format '{{.State.Status}}' flotilla-under-test)" = running ] \
  || fail "exited with a lease still held, before the grace period"
code=$(curl -s -o /dev/null -w '%{http_code}' "127.0.0.1:$metrics_port/readyz")
[ "$code" = 503 ] || fail "/readyz answered $code while draining"
code=$(curl -s -o /dev/null -w '%{http_code}' -X POST -H "$auth" "$api/v1/pools/local/leases")
[ "$code" = 503 ] || fail "a reservation while draining got $code"
curl -sf -X POST -H "$auth" "$api/v1/pools/local/leases/$id/release" > /dev/null
status=$(timeout 20 docker wait flotilla-under-test) || fail "still running 20 s after the release"
took=$(python3 -c "import time,sys; print(round(time.time() - float(sys.argv[1]), 1))" "$sent")
[ "$status" = 0 ] || fail "exit status $status"
echo "exited 0, ${took} s after SIGTERM (grace 20 s)"
docker logs flotilla-under-test 2>&1 | python3 -c '
import json, sys
lines = [json.loads(l) for l in sys.stdin if l.startswith("{")]
assert any(l.get("message") == "stopped" for l in lines), "no stopped line"
' || fail "the log does not end with a clean stop"
docker rm flotilla-under-test > /dev/null

echo "== container: a second run on the same volumes loads the plugin from the compile cache"
start
docker logs flotilla-under-test 2>&1 | python3 -c '
import json, sys
loaded = [json.loads(l) for l in sys.stdin if "\"plugin loaded\"" in l]
assert loaded and not loaded[0]["cache"].startswith("Compiled"), loaded
' || fail "the compile cache on the volume was not used"
docker kill --signal TERM flotilla-under-test > /dev/null
status=$(timeout 20 docker wait flotilla-under-test) || fail "no stop without leases"
[ "$status" = 0 ] || fail "exit status $status"
docker rm flotilla-under-test > /dev/null
docker volume rm flotilla-cache flotilla-state > /dev/null
