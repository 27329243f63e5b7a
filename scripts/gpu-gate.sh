#!/usr/bin/env bash
# The GPU gate, for a machine with an NVIDIA GPU, in one go (budget: 12 minutes on one H200):
#   1. set-up (harness, pinned tree, patch stack, models) as scripts/setup.sh does;
#   2. a CUDA build for this GPU only (CMAKE_CUDA_ARCHITECTURES=native) with only the
#      flash-attention vector instances the gates use (f16-f16, q8_0-q8_0), patched and, for the
#      identity gate, upstream;
#   3. the new ops' backend tests, CUDA against CPU (test-backend-ops -b CUDA0);
#   4. the identity and select-all anchor gate, niah and the decode A/B on SmolLM2 (7K-8K) and
#      Gemma 3 (16K, 32K), f16 and q8_0 KV, every layer offloaded (gates/gpu/*.yaml).
# Everything lands in one folder, results/gpu-gate-<time>/, with a summary at the end.
#   scripts/gpu-gate.sh                 all of it
#   scripts/gpu-gate.sh --no-upstream   skip the upstream build and the identity gate's upstream arm
set -uo pipefail
cd "$(dirname "$0")/.."

with_upstream=1
[ "${1:-}" = "--no-upstream" ] && with_upstream=0

out="results/gpu-gate-$(date -u +%Y%m%d-%H%M%S)"
mkdir -p "$out"
exec > >(tee "$out/gpu-gate.log") 2>&1

t0=$(date +%s)
failed=()
stage() { echo; echo "== [$(( $(date +%s) - t0 )) s] $*"; }
run() {  # run a step; a failure is recorded and the script goes on to the next one
  local name=$1; shift
  if ! "$@"; then
    echo "!! $name failed"
    failed+=("$name")
  fi
}

stage "GPU"
nvidia-smi --query-gpu=name,compute_cap,memory.total,driver_version --format=csv | tee "$out/gpu.csv" || {
  echo "no NVIDIA GPU visible (nvidia-smi failed): this script is for a GPU machine"; exit 2; }

stage "set-up: harness, pinned upstream tree, patch stack, models"
SKBUILD_CMAKE_DEFINE="LLAMA_SPARSE_NATIVE=OFF" python3 -m pip install -q --disable-pip-version-check -e '.[test]' || exit 2
llama-sparse vendor || exit 2
llama-sparse patches apply || exit 2
llama-sparse models fetch smollm2-135m || exit 2
llama-sparse models fetch gemma3-270m || exit 2

jobs=$(nproc)
cuda=(--cuda -j "$jobs" --define CMAKE_CUDA_ARCHITECTURES=native --define "GGML_CUDA_FA_QUANTS=f16-f16;q8_0-q8_0")

stage "build: patched, CUDA for this GPU only"
llama-sparse build "${cuda[@]}" --target llama-server --target test-backend-ops --target llama-sparse-logits || exit 2
if [ $with_upstream = 1 ]; then
  stage "build: upstream, CUDA for this GPU only (identity gate)"
  llama-sparse build --upstream "${cuda[@]}" --target llama-server --target llama-sparse-logits || exit 2
fi

stage "backend tests: the new ops and the flash-attention block skip, CUDA against CPU"
for op in SPARSE_ATTN_FILL SPARSE_ATTN_SELECT; do
  run "test-backend-ops $op" bash -c "build/patched/bin/test-backend-ops -b CUDA0 -o $op 2>&1 | tee '$out/backend-ops-$op.txt'"
done
run "test-backend-ops FLASH_ATTN_EXT block_size" bash -c \
  "build/patched/bin/test-backend-ops -b CUDA0 -o FLASH_ATTN_EXT -p block_size 2>&1 | tee '$out/backend-ops-FLASH_ATTN_EXT-block_size.txt'"

identity=gates/gpu/identity.yaml
[ $with_upstream = 0 ] && identity=gates/gpu/anchor.yaml
for g in "$identity" gates/gpu/niah.yaml gates/gpu/niah-gemma3.yaml gates/gpu/ab.yaml gates/gpu/ab-gemma3.yaml; do
  stage "gate $g"
  run "gate $g" llama-sparse gate "$g" --out "$out"
done

stage "summary"
grep -h "passed\|FAIL" "$out"/backend-ops-*.txt | grep -v "^\s*$" | tail -n 12 || true
for md in "$out"/gpu-*/report.md; do
  [ -f "$md" ] && sed -n '1p;/^| arm/,/^$/p' "$md"
done
echo "results: $out ($(( $(date +%s) - t0 )) s)"
if [ ${#failed[@]} -gt 0 ]; then
  echo "failed: ${failed[*]}"
  exit 1
fi
