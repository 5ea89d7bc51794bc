#!/usr/bin/env bash
# Prompt cache + PLD benchmarks on the CPU (and on CUDA when nvcc is there):
#   1. bench_pcache: TTFT of a request sharing a 2048-token prefix with a
#      cached one vs cold, on a ~1B qwen3_5 made by sanctum-synth
#      (bench/bench_pcache_1b.json: the 1B shape of bench/configs with the
#      Qwen3 tokenizer's 151669 ids, so every id decodes);
#   2. bench_pld: decode tok/s with PLD vs without, nothing to copy (random
#      prompt, the 1B) and copy-heavy (models/default's "Repeat exactly" task).
# Each result line is printed and appended to the log with its command.
# Usage: bench/bench_pcache.sh [--threads N] [--log FILE] [--work DIR] [--cuda]
set -euo pipefail
cd "$(dirname "$0")/.."
threads=0; log=bench/results.log; work=${TMPDIR:-/tmp}/sn_bench_pcache; cuda=0
while [ $# -gt 0 ]; do
    case "$1" in
        --threads) threads=$2; shift 2 ;;
        --log) log=$2; shift 2 ;;
        --work) work=$2; shift 2 ;;
        --cuda) cuda=1; shift ;;
        *) echo "usage: $0 [--threads N] [--log FILE] [--work DIR] [--cuda]" >&2; exit 2 ;;
    esac
done
jobs=$(nproc); [ "$jobs" -gt 16 ] && jobs=16
mkdir -p "$work"
B=build-bench-cpu
make -s -j"$jobs" SN_CUDA=0 BUILD=$B $B/sanctum-synth $B/bench/bench_pcache $B/bench/bench_pld
[ -f "$work/1b/model.safetensors" ] || $B/sanctum-synth --config bench/bench_pcache_1b.json --out "$work/1b" >/dev/null
[ -f "$work/tokenizer.json" ] || gzip -dc tests/fixtures/tokenizer/qwen3/tokenizer.json.gz > "$work/tokenizer.json"
host="$(nproc) cpus, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')"
echo "host: $host"
$B/bench/bench_pcache --model "$work/1b" --tokenizer "$work/tokenizer.json" --prefix 2048 --tail 32 --reps 3 \
    --threads "$threads" --log "$log"
$B/bench/bench_pld --model "$work/1b" --tokenizer "$work/tokenizer.json" --task random --n 2 --max-tokens 48 \
    --reps 3 --threads "$threads" --log "$log"
if [ -f models/default/config.json ]; then
    $B/bench/bench_pld --model models/default --task copy --n 32 --words 8 --max-tokens 40 --reps 5 \
        --threads "$threads" --log "$log"
    $B/bench/bench_pld --model models/default --task random --n 8 --max-tokens 64 --reps 5 \
        --threads "$threads" --log "$log"
fi
if [ "$cuda" = 1 ] && command -v nvcc >/dev/null; then
    C=build-bench-cuda
    make -s -j"$jobs" BUILD=$C $C/bench/bench_pcache $C/bench/bench_pld
    $C/bench/bench_pcache --backend cuda --model "$work/1b" --tokenizer "$work/tokenizer.json" --prefix 2048 \
        --tail 32 --reps 5 --log "$log"
    $C/bench/bench_pld --backend cuda --model "$work/1b" --tokenizer "$work/tokenizer.json" --task random --n 2 \
        --max-tokens 64 --reps 3 --log "$log"
    [ -f models/default/config.json ] && $C/bench/bench_pld --backend cuda --model models/default --task copy \
        --n 32 --words 8 --max-tokens 40 --reps 5 --log "$log"
fi
