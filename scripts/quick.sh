#!/usr/bin/env bash
# The quick loop's tests (called by `./scripts/test.sh --quick [REV]` after formatting and
# clippy): the tests of what changed since REV (default HEAD), and a list of what it skipped.
#
# - a host crate changed (host/NAME/...): that crate's tests;
# - the binary crate: its unit tests, plus the modules of its one integration test binary
#   that changed (host/flotilla/tests/all/X.rs or X/, run as the filter `X::`; a change to
#   the helpers they share, tests/all/common/ or main.rs, runs them all);
# - a guest, a plugin, a template, deploy/ or a script: not run here; the full run covers it.
#
# FLOTILLA_QUICK_DRY_RUN=1 prints the cargo commands instead of running them.
set -euo pipefail
cd "$(dirname "$0")/.."
base="${1:-HEAD}"
run() {
  if [ -n "${FLOTILLA_QUICK_DRY_RUN:-}" ]; then echo "would run: $*"; else "$@"; fi
}
changed=$( { git diff --name-only "$base" --; git ls-files --others --exclude-standard; } | sort -u)
if [ -z "$changed" ]; then
  echo "== quick: nothing changed since $base"
  exit 0
fi

packages=()
tests=()
skipped=()
for f in $changed; do
  case "$f" in
    host/flotilla/tests/all/common/*|host/flotilla/tests/all/main.rs) tests+=(all) ;;
    host/flotilla/tests/all/*/*) tests+=("$(basename "$(dirname "$f")")") ;;
    host/flotilla/tests/all/*.rs) tests+=("$(basename "$f" .rs)") ;;
    host/flotilla/tests/*) tests+=(all) ;;
    host/flotilla/*) packages+=(flotilla) ;;
    tests/clouds/*|plugins/aws/*|plugins/gcp/*|plugins/azure/*) packages+=(flotilla-cloud-suites) ;;
    host/*/*)
      dir=$(echo "$f" | cut -d/ -f1-2)
      [ -f "$dir/Cargo.toml" ] && packages+=("$(sed -n 's/^name = "\(.*\)"/\1/p' "$dir/Cargo.toml" | head -1)") ;;
    *) skipped+=("$f") ;;
  esac
done

# Target flags apply to every package of one cargo call, so the binary crate gets its own.
rooms=()
binary=()
for p in $(printf '%s\n' "${packages[@]}" | sort -u); do
  if [ "$p" = flotilla ]; then
    binary+=(--lib)
  else
    rooms+=(-p "$p")
  fi
done
# The integration binary's modules, as test-name filters (`gitlab::`); none means all of it.
filters=()
whole=
for t in $(printf '%s\n' "${tests[@]}" | sort -u); do
  if [ "$t" = all ]; then
    whole=1
  elif [ -e "host/flotilla/tests/all/$t.rs" ] || [ -d "host/flotilla/tests/all/$t" ]; then
    filters+=("$t::")
  fi
done
[ -n "$whole" ] && filters=()
if [ ${#skipped[@]} -gt 0 ]; then
  echo "== quick: not run here (the full run covers them):"
  printf '   %s\n' "${skipped[@]}"
fi
integration=$([ -n "$whole" ] || [ ${#filters[@]} -gt 0 ] && echo 1 || true)
if [ ${#rooms[@]} -eq 0 ] && [ ${#binary[@]} -eq 0 ] && [ -z "$integration" ]; then
  echo "== quick: no host code changed"
  exit 0
fi
if [ ${#rooms[@]} -gt 0 ]; then
  echo "== quick: cargo test --profile test-run ${rooms[*]}"
  run cargo test --locked --profile test-run "${rooms[@]}"
fi
if [ ${#binary[@]} -gt 0 ]; then
  echo "== quick: cargo test --profile test-run -p flotilla ${binary[*]}"
  run cargo test --locked --profile test-run -p flotilla "${binary[@]}"
fi
if [ -n "$integration" ]; then
  echo "== quick: cargo test --profile test-run -p flotilla --test all ${filters[*]}"
  run cargo test --locked --profile test-run -p flotilla --test all -- "${filters[@]}"
fi
