#!/usr/bin/env bash
# Set up and run memhook's whole test suite (real targets, real gdb; needs root for ptrace).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --tests
as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }
# The pytest script, not `python -m pytest`: the checkout must not shadow the installed package.
as_root .venv/bin/pytest -q -p no:cacheprovider "$@" tests
