#!/usr/bin/env bash
# Set up a fresh machine for llama-sparse, idempotently: system tools, the Python harness,
# the pinned upstream tree with our patches, the builds and the models.
#   scripts/setup.sh            patched build of llama-server, llama-cli, llama-bench, test-backend-ops
#   scripts/setup.sh --tests    also upstream's CPU unit tests and the unpatched build (identity gate)
set -euo pipefail
cd "$(dirname "$0")/.."

with_tests=0
[ "${1:-}" = "--tests" ] && with_tests=1

need=()
for tool in cmake:cmake ninja:ninja-build ccache:ccache g++:g++ git:git; do
  command -v "${tool%%:*}" >/dev/null 2>&1 || need+=("${tool#*:}")
done
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "== installing ${need[*]} (apt)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  else
    echo "missing tools: ${need[*]}; install them (Debian: apt-get install ${need[*]})" >&2
    [[ " ${need[*]} " == *" cmake "* || " ${need[*]} " == *" g++ "* || " ${need[*]} " == *" git "* ]] && exit 1
  fi
fi

echo "== installing the llama-sparse harness (Python)"
# The harness only: the native build is driven by `llama-sparse build` into build/, incrementally.
SKBUILD_CMAKE_DEFINE="LLAMA_SPARSE_NATIVE=OFF" python3 -m pip install -q --disable-pip-version-check -e '.[test]'

echo "== fetching the pinned upstream tree and applying the patch stack"
llama-sparse vendor
llama-sparse patches apply

echo "== building (2 jobs, ccache)"
if [ $with_tests = 1 ]; then
  llama-sparse build --tests
  llama-sparse build --upstream --target llama-server --target llama-sparse-logits
  echo "== llama-cpp-python from the pinned sdist, without its native build (it loads our DSO)"
  llama-sparse python-bindings install
else
  llama-sparse build
fi

echo "== fetching models"
llama-sparse models fetch smollm2-135m
