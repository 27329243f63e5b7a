#!/usr/bin/env bash
# The whole test suite on a fresh machine: set-up, then every test, slow ones included.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --tests
echo "== tests"
python3 -m pytest --runslow -ra "$@" tests
