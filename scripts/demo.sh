#!/usr/bin/env bash
# Set up, start the bundled leaky service, attach memhook to it for a few seconds, and show
# which call stacks hold the memory it never frees. Usage: scripts/demo.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh

seconds=${1:-8}
build=$(mktemp -d)
trap 'kill "$pid" 2>/dev/null || true; rm -rf "$build"' EXIT
g++ -O1 -g -fno-omit-frame-pointer -pthread scripts/demo/leaky_service.cpp -o "$build/leaky_service"
"$build/leaky_service" &
pid=$!
sleep 1

as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }
as_root .venv/bin/memhook -p "$pid" --duration "$seconds" --interval 2 --top 3 -o "$build/demo.mh"
echo
echo "The same capture as JSON, an excerpt (memhook report FILE --format json: every field):"
as_root .venv/bin/memhook report "$build/demo.mh" --format json --top 1 > "$build/demo.json"
.venv/bin/python - "$build/demo.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
s = r["sites"][0]
frame = s["frames"][s.get("attributed_frame") or 0]
keys = ("outstanding_bytes", "outstanding_count", "alloc_count", "free_count")
print(json.dumps({"totals": {k: v for k, v in r["totals"].items() if k in keys},
                  "sites[0]": {**{k: s[k] for k in keys if k in s},
                               "attributed_frame": {k: frame.get(k)
                                                    for k in ("function", "file", "line")}}},
                 indent=1))
PY
