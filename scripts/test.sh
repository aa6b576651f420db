#!/usr/bin/env bash
# Set up and run memhook's whole test suite, both tiers:
#   tests/unit         no root, no GDB: analysis, reports, capture format, the native parts,
#                      the wheels' contents, the docs; two at a time
#   tests/integration  real targets, real GDB, as root; two at a time (pytest-xdist) but for
#                      the timed ones (marked serial), which run afterwards with nothing beside
#                      them; tests that keep every core busy share one worker (xdist_group).
# With arguments, runs pytest with them instead (e.g. scripts/test.sh tests/unit -k merge).
set -uo pipefail
cd "$(dirname "$0")/.."
t0=$SECONDS
stage() { echo "test.sh: $1 took $(( SECONDS - t0 )) s"; t0=$SECONDS; }
scripts/setup.sh --tests || exit 1
stage "set-up"
export MEMHOOK_REQUIRE_ROOTS=1  # setup built the Debian roots: a missing one fails its tests
export MEMHOOK_REQUIRE_WHEELS=1  # and the wheels
as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }
# The pytest script, not `python -m pytest`: the checkout must not shadow the installed package.
pytest=(.venv/bin/pytest -q -p no:cacheprovider)
if [ $# -gt 0 ]; then
  as_root "${pytest[@]}" "$@"
  exit
fi
results=$(mktemp -d)
trap 'rm -rf "$results"' EXIT
status=0
"${pytest[@]}" --junitxml="$results/unit.xml" -n 2 tests/unit || status=1
stage "the unit tier"
as_root "${pytest[@]}" --junitxml="$results/parallel.xml" -n 2 --dist loadgroup -m "not serial" --durations=15 \
  tests/integration || status=1
stage "the integration tier"
as_root "${pytest[@]}" --junitxml="$results/serial.xml" -m serial tests/integration || status=1
stage "the timed tests"
# One closing line for the three runs.
.venv/bin/python - "$results"/*.xml <<'PY'
import sys
import xml.etree.ElementTree as ET
n = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
for path in sys.argv[1:]:
    for suite in ET.parse(path).getroot().iter("testsuite"):
        for k in n:
            n[k] += int(suite.get(k, 0))
failed = n["failures"] + n["errors"]
print(f"total: {n['tests'] - failed - n['skipped']} passed, {failed} failed, {n['skipped']} skipped")
PY
exit $status
