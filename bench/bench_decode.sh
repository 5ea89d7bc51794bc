#!/usr/bin/env bash
# Decode and prefill speed of sanctum-run on sanctum-synth models (random
# weights, real shapes), with the GB/s of weights streamed per decoded token
# set against this machine's measured memory read bandwidth.
#
#   bench/bench_decode.sh [--build DIR] [--dir MODELS] [--threads N] [--prompt N] [--tokens N]
#                         [--weights auto|mmap|copy] [--precision exact|fast] [CONFIG.json ...]
#
# Default configs: bench/configs/qwen3_5_1b.json. A model whose checkpoint
# would not fit in MemAvailable (with 2 GB to spare) is skipped with a note.
# Each result is printed and appended to bench/results.log with the command.
set -euo pipefail
cd "$(dirname "$0")/.."
cmdline="bench/bench_decode.sh $*"
# the CPU kernel knobs change what is measured: name them in the logged command
for v in SANCTUM_CPU_Q4 SANCTUM_CPU; do
    [ -n "${!v:-}" ] && cmdline="$v=${!v} $cmdline"
done
build=build; dir=/tmp/sanctum-bench; threads=$(nproc); prompt=128; tokens=32; weights=auto; precision=exact; configs=()
while [ $# -gt 0 ]; do
    case $1 in
        --build) build=$2; shift 2 ;;
        --dir) dir=$2; shift 2 ;;
        --threads) threads=$2; shift 2 ;;
        --prompt) prompt=$2; shift 2 ;;
        --tokens) tokens=$2; shift 2 ;;
        --weights) weights=$2; shift 2 ;;
        --precision) precision=$2; shift 2 ;;
        -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
        *) configs+=("$1"); shift ;;
    esac
done
[ ${#configs[@]} -eq 0 ] && configs=(bench/configs/qwen3_5_1b.json)
for b in sanctum-run sanctum-synth; do
    [ -x "$build/$b" ] || make -j2 BUILD="$build" "$build/$b" >/dev/null
done
mkdir -p "$dir"
cc -O2 -pthread -o "$dir/membw" bench/membw.c
bw=$("$dir/membw" 2048 "$threads" 2>/dev/null)
echo "memory read bandwidth: $bw GB/s ($threads threads)"

# Bytes of weights one decoded token reads: every tensor, except that of an
# expert stack only top-k of E experts are read, and of an untied embedding
# one row (a tied one is the lm_head, read whole).
active_bytes() {
    python3 - "$1" <<'PY'
import json, struct, sys, glob, os
d = sys.argv[1]
cfg = json.load(open(os.path.join(d, "config.json")))
tc = cfg.get("text_config", cfg)
E, k = tc.get("num_experts", 0) or 0, tc.get("num_experts_per_tok", 0) or 0
tied = tc.get("tie_word_embeddings", cfg.get("tie_word_embeddings", False))
tot = 0.0
for f in glob.glob(os.path.join(d, "*.safetensors")):
    with open(f, "rb") as fh:
        n = struct.unpack("<Q", fh.read(8))[0]
        hdr = json.loads(fh.read(n))
    for name, t in hdr.items():
        if name == "__metadata__":
            continue
        b = t["data_offsets"][1] - t["data_offsets"][0]
        if E and (".switch_mlp." in name or ".experts." in name):
            b = b * k / E
        if not tied and "embed_tokens." in name:
            b = b / t["shape"][0]  # an untied embedding: one row per token (the lm_head is its own tensor)
        tot += b
print(int(tot))
PY
}

for cfg in "${configs[@]}"; do
    name=$(basename "$cfg" .json)
    out="$dir/$name"
    if [ ! -f "$out/model.safetensors" ] && [ ! -f "$out/model.safetensors.index.json" ]; then
        echo "== writing $name with sanctum-synth"
        "$build/sanctum-synth" --config "$cfg" --out "$out" >/dev/null
    fi
    size_mb=$(( $(du -cb "$out"/*.safetensors | tail -1 | cut -f1) >> 20 ))
    avail_mb=$(( $(awk '/MemAvailable/ {print $2}' /proc/meminfo) >> 10 ))
    if [ "$size_mb" -gt $((avail_mb - 2048)) ]; then
        line="$(date -u +%FT%TZ) bench_decode $name: SKIPPED, weights $size_mb MB do not fit in MemAvailable $avail_mb MB | cmd: $cmdline"
        echo "$line"; echo "$line" >> bench/results.log
        continue
    fi
    ids=$(seq 1000 $((1000 + prompt - 1)) | paste -sd, -)
    # warm the page cache so the first tokens do not measure the disk
    cat "$out"/*.safetensors > /dev/null
    log=$("$build/sanctum-run" --model "$out" --ids "$ids" --max-tokens "$tokens" --print-ids --threads "$threads" \
        --weights "$weights" --precision "$precision" 2>&1 >/dev/null)
    # where the weights were read from, and how long the load took (the copy is part of it)
    where=$(echo "$log" | sed -nE 's/.*; weights (copied into memory|mapped), precision ([a-z]+)\) in ([0-9.]+) s.*/\1, precision \2, loaded in \3 s/p')
    stat=$(echo "$log" | grep 'prefill .* tok/s')
    pre=$(echo "$stat" | sed -E 's/.*prefill [0-9]+ tokens in [0-9.]+ s \(([0-9.]+) tok\/s\).*/\1/')
    dec=$(echo "$stat" | sed -E 's/.*decode [0-9]+ tokens in [0-9.]+ s \(([0-9.]+) tok\/s\).*/\1/')
    act=$(active_bytes "$out")
    gbs=$(awk -v a="$act" -v d="$dec" 'BEGIN {printf "%.2f", a * d / 1e9}')
    pct=$(awk -v g="$gbs" -v b="$bw" 'BEGIN {printf "%.0f", 100 * g / b}')
    line="$(date -u +%FT%TZ) $(git rev-parse --short HEAD)$(git diff --quiet HEAD 2>/dev/null || echo +dirty) bench_decode $name: prefill $prompt tok $pre tok/s, decode $dec tok/s, $(awk -v a="$act" 'BEGIN {printf "%.1f", a / 1e6}') MB weights/token -> $gbs GB/s = $pct% of measured read bandwidth $bw GB/s (goal >= 60%), $threads threads, $(nproc) cpus, weights $where | cmd: $cmdline"
    echo "$line"
    echo "$line" >> bench/results.log
done
