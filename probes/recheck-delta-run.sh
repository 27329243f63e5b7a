#!/usr/bin/env bash
# The runs behind probes/recheck-delta.py: every decode step of `--sparse-attn on` computed again
# densely (--sparse-attn-recheck 100) and logged by a build with recheck-delta.diff applied
# (LLAMA_SPARSE_RECHECK_PROBE), on the summary and docs prompts of the speed gates (f16, 8K, 128
# tokens) and on the user-path prompts of the 18 needles dense finds. About 25 minutes on 2 cores.
# Usage: bash probes/recheck-delta-run.sh OUT_DIR   (then python probes/recheck-delta.py NAME=OUT_DIR/X.jsonl ...)
set -euo pipefail
out=${1:?usage: recheck-delta-run.sh OUT_DIR}
mkdir -p "$out"
probe_arm='{"name": "probe", "flags": ["--sparse-attn", "on", "--sparse-attn-recheck", "100"], "coverage": 0.25}'
for g in ab-defaults-prose ab-defaults; do
  python3 -c "import sys,yaml,json; d=yaml.safe_load(open('gates/$g.yaml')); d.update(cache_types=['f16'], n_predict=128, arms=['dense', json.loads(sys.argv[1])]); yaml.safe_dump(d, open('$out/$g.yaml','w'), sort_keys=False)" "$probe_arm"
  LLAMA_SPARSE_RECHECK_PROBE="$out/$g.jsonl" llama-sparse gate "$out/$g.yaml" --out "$out/results"
done
for f in 4k-multikey1 4k-multikey2 7k-multikey1 7k-multikey2; do
  python3 -c "import sys,yaml,json; a=json.loads(sys.argv[1]); a.pop('coverage'); d=yaml.safe_load(open('probes/user-path-$f.yaml')); d['arms']=[a]; yaml.safe_dump(d, open('$out/$f.yaml','w'), sort_keys=False)" "$probe_arm"
  LLAMA_SPARSE_RECHECK_PROBE="$out/$f.jsonl" llama-sparse gate "$out/$f.yaml" --out "$out/results"
done
