#!/usr/bin/env bash
# The host on Windows, checked under Wine: cross-builds flotilla.exe and the lean driver
# flotilla-gitlab.exe (x86_64-pc-windows-gnu) and runs them there: `plugin check` on the
# static and AWS plugins, `config check`, and `run` with the quick-start config, with a lease
# reserved, acquired and released over loopback HTTP, and the driver asking it for the pool's
# slots.
# Needs the guests built by scripts/test.sh, wine64 and gcc-mingw-w64-x86-64.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/flotilla-target}"
./scripts/cross-build.sh windows

exe_dir="$CARGO_TARGET_DIR/x86_64-pc-windows-gnu/${FLOTILLA_WINDOWS_PROFILE:-release}"
guests="$CARGO_TARGET_DIR/wasm-guests/wasm32-wasip2/guest"
# Wine 8.0 lacks bcryptprimitives.dll (see the shim's comment and ../shared/PEERS.md).
x86_64-w64-mingw32-gcc -shared -O2 -o "$exe_dir/bcryptprimitives.dll" tests/peers/wine/bcryptprimitives.c -ladvapi32

export WINEPREFIX="${WINEPREFIX:-$HOME/.cache/flotilla-wine}" WINEDEBUG=-all
wine=/usr/lib/wine/wine64
work=$(mktemp -d)
cleanup() {
  # Ends every process of this Wine prefix (killing the launcher leaves the .exe running).
  /usr/lib/wine/wineserver -k 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
flotilla() { "$wine" "$exe_dir/flotilla.exe" "$@"; }

echo "== windows: plugin check"
for p in flotilla_plugin_static flotilla_plugin_aws; do
  flotilla plugin check "$guests/$p.wasm" | tee "$work/check.txt"
  grep -q "OK: a valid Flotilla provider plugin" "$work/check.txt"
done

flotilla plugin check builtin:static | tee "$work/check.txt"
grep -q "OK: a valid Flotilla provider plugin" "$work/check.txt"

echo "== windows: config check"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
sed "s/127.0.0.1:8080/127.0.0.1:$port/" examples/quickstart.toml > "$work/quickstart.toml"
flotilla config check -c "$work/quickstart.toml"
# A broken config names the file, the line and the key on Windows too.
printf '[server]\nlisten = "nowhere"\n' > "$work/broken.toml"
if flotilla config check -c "$work/broken.toml" 2> "$work/broken.txt"; then
  echo "a broken config passed"; exit 1
fi
grep -q "broken.toml:2: server.listen" "$work/broken.txt" || { cat "$work/broken.txt"; exit 1; }

echo "== windows: run, with a lease reserved, acquired and released"
flotilla run -c "$work/quickstart.toml" > "$work/run.log" 2>&1 &
api="http://127.0.0.1:$port"
auth="Authorization: Bearer quickstart-token"
for _ in $(seq 1 300); do
  curl -sf -H "$auth" "$api/readyz" > /dev/null && break
  sleep 0.2
done
curl -sf -H "$auth" "$api/readyz" > /dev/null || { cat "$work/run.log"; exit 1; }
id=$(curl -sf -X POST -H "$auth" "$api/v1/pools/local/leases" | python3 -c 'import json,sys; print(json.load(sys.stdin)["lease"]["id"])')
curl -sf -X POST -H "$auth" "$api/v1/pools/local/leases/$id/acquire" | tee "$work/acquire.json"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["instance"], d' "$work/acquire.json"
curl -sf -X POST -H "$auth" "$api/v1/pools/local/leases/$id/release" > /dev/null
curl -sf -H "$auth" "$api/v1/pools/local/leases" | python3 -c 'import json,sys; l=json.load(sys.stdin)["leases"]; assert not l, l'
echo
echo "== windows: the lean driver asks the running host for its pool's slots"
FLOTILLA_TOKEN=quickstart-token "$wine" "$exe_dir/flotilla-gitlab.exe" --url "$api" --pool local snippet \
  > "$work/snippet.toml"
grep -q '^  limit = [0-9]' "$work/snippet.toml" || { cat "$work/snippet.toml" "$work/run.log"; exit 1; }
echo "windows: lease $id reserved, acquired and released through flotilla.exe; flotilla-gitlab.exe read the pool's slots"
