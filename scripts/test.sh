#!/usr/bin/env bash
# Set up and run memhook's whole test suite (real targets, real gdb; needs root for ptrace).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }
as_root .venv/bin/python -m pytest -q -p no:cacheprovider "$@" tests
