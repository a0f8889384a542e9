#!/usr/bin/env bash
# Prints `-p <package>` for every guest component: the workspace members whose manifest has
# `[package.metadata.flotilla-guest]`. tests/artifacts/build.rs reads the same metadata, so the
# list of guests is kept in one place: each guest's own Cargo.toml.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo metadata --format-version 1 --no-deps --locked | python3 -c '
import json, sys
meta = json.load(sys.stdin)
names = sorted(p["name"] for p in meta["packages"] if "flotilla-guest" in (p.get("metadata") or {}))
if not names:
    sys.exit("no workspace member has [package.metadata.flotilla-guest]")
print(" ".join("-p " + n for n in names))
'
