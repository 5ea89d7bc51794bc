#!/usr/bin/env bash
# Parity smoke on the shipped default model: the 10 prompts of
# tests/parity-smoke.json at temperature 0 must reproduce transformers'
# greedy tokens exactly and contain their known-good substrings.
# Usage: suite_parity.sh BUILD [cpu|cuda]   Ends with "N passed, N failed".
set -u
build=${1:-build}
backend=${2:-cpu}
cd "$(dirname "$0")/.."
if [ ! -x "$build/sanctum-run" ]; then
    echo "  SKIP: $build/sanctum-run is not built"
    echo "0 passed, 0 failed"
    exit 0
fi
exec python3 tools/python/check_parity.py --bin "$build/sanctum-run" --model models/default \
    --battery tests/parity-smoke.json --backend "$backend"
