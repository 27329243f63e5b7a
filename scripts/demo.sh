#!/usr/bin/env bash
# The main job on a fresh machine: set-up, then the demo run on SmolLM2.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
llama-sparse demo "$@"
