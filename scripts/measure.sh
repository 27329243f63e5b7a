#!/usr/bin/env bash
# The measured figures of the closing notes, in one go (about 90 minutes on 2 cores). Each gate
# writes results/<gate>-<time>/ (JSON, markdown table, plot). Run nothing else meanwhile: the
# A/B speed gates want the machine to themselves.
set -uo pipefail
cd "$(dirname "$0")/.."
for gate in "$@"; do
  echo "== $gate"
  CI=${CI:-true} llama-sparse gate "gates/$gate.yaml" | grep -v '^\[' || echo "gate $gate: exit $?"
done
