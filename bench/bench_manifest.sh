#!/usr/bin/env bash
# Manifest gate throughput: verify (ed25519 + parallel SHA-256 of every
# listed file) of a multi-GB synthetic model, against the two bounds that
# limit it: the disk's read bandwidth (all files read in parallel with
# O_DIRECT dd, no page cache) and the SHA-256 rate of the cores that can be
# busy (openssl speed x min(cores, threads, files): one file is one
# sequential hash). "cold" drops the files' page cache first (dd
# iflag=nocache); a VM's host may still cache, so cold can beat the disk
# figure, which bypasses both caches.
#
#   bench/bench_manifest.sh [BUILD] [--gb N] [--shards N] [--dir DIR] [--threads N] [--synth CONFIG]
#
# Default: 4 GB of random data in 4 shards named like a sharded checkpoint,
# under a scratch dir in /tmp (removed afterwards). --synth CONFIG makes the
# model with BUILD/sanctum-synth instead (e.g. bench/configs/qwen3_5_1b.json).
# Appends one line to bench/results.log with the command that reproduces it.
set -euo pipefail
cd "$(dirname "$0")/.."
build=build
[ $# -gt 0 ] && [ "${1#--}" = "$1" ] && { build=$1; shift; }
gb=4; shards=4; dir=""; threads=$(nproc); synth=""
args="$*"
while [ $# -gt 0 ]; do
    case "$1" in
        --gb) gb=$2; shift 2 ;;
        --shards) shards=$2; shift 2 ;;
        --dir) dir=$2; shift 2 ;;
        --threads) threads=$2; shift 2 ;;
        --synth) synth=$2; shift 2 ;;
        *) echo "bench_manifest: unknown argument $1" >&2; exit 2 ;;
    esac
done
signer=$build/sign_manifest
[ -x "$signer" ] || { echo "bench_manifest: $signer not built (make $signer)" >&2; exit 1; }
scratch=$(mktemp -d "${dir:-/tmp}/sn_bench_manifest_XXXXXX")
trap 'rm -rf "$scratch"' EXIT
model=$scratch/model
mkdir -p "$model"
now() { date +%s.%N; }
rate() { awk -v b="$1" -v t="$2" 'BEGIN { printf "%.2f", b / 1e9 / t }'; }

# ---- the model
t0=$(now)
if [ -n "$synth" ]; then
    "$build/sanctum-synth" --config "$synth" --out "$model" --shard-size 1G >/dev/null
else
    per=$(( gb * 1024 / shards ))   # MiB per shard
    for i in $(seq 1 "$shards"); do
        name=$(printf 'model-%05d-of-%05d.safetensors' "$i" "$shards")
        dd if=/dev/urandom of="$model/$name" bs=4M count=$(( per / 4 )) iflag=fullblock status=none
    done
    echo '{"model_type":"qwen3_5"}' > "$model/config.json"
fi
bytes=$(du -sb "$model" | cut -f1)
echo "model: $model, $(awk -v b="$bytes" 'BEGIN{printf "%.2f", b/1e9}') GB in $(ls "$model" | wc -l) files (made in $(awk -v a="$t0" -v b="$(now)" 'BEGIN{printf "%.1f", b-a}') s)"

# ---- keys, manifest, signature
"$signer" keygen --out "$scratch/key" 2>/dev/null
t0=$(now)
"$signer" create --model "$model" --threads "$threads" > "$scratch/manifest"
t_create=$(awk -v a="$t0" -v b="$(now)" 'BEGIN{print b-a}')
"$signer" sign --key "$scratch/key" "$scratch/manifest" 2>/dev/null

# ---- bounds
# Disk: every file read at once with O_DIRECT (no page cache), as the
# verify reads them: one stream per file, all in parallel.
first=$(ls "$model"/*.safetensors | head -n 1)
fbytes=$(stat -c %s "$first")
sync
t0=$(now)
for f in "$model"/*; do dd if="$f" of=/dev/null bs=8M iflag=direct status=none & done
wait
disk=$(rate "$bytes" "$(awk -v a="$t0" -v b="$(now)" 'BEGIN{print b-a}')")
core=""
if command -v openssl >/dev/null; then
    core=$(openssl speed -evp sha256 -bytes 1048576 -seconds 2 2>/dev/null |
           awk '/^sha256/ { sub("k", "", $2); printf "%.2f", $2 * 1000 / 1e9 }')
fi
if [ -z "$core" ]; then   # no openssl CLI: time our own hash of one warm shard on one thread
    mkdir -p "$scratch/one"; ln -s "$first" "$scratch/one/x.safetensors"
    cat "$first" > /dev/null; t0=$(now)
    "$signer" create --model "$scratch/one" --threads 1 > /dev/null
    core=$(rate "$fbytes" "$(awk -v a="$t0" -v b="$(now)" 'BEGIN{print b-a}')")
fi
cores=$(nproc)
nfiles=$(ls "$model" | wc -l)
# One file is one sequential SHA-256 stream: parallelism is capped by the
# file count as well as by cores and threads.
par=$(awk -v n="$cores" -v t="$threads" -v f="$nfiles" 'BEGIN { m = n < t ? n : t; m = m < f ? m : f; print m }')
hashbound=$(awk -v c="$core" -v m="$par" 'BEGIN { printf "%.2f", c * m }')

# ---- verify: cold (file pages dropped), then warm, then one thread warm
drop() { sync; for f in "$model"/*; do dd if="$f" iflag=nocache count=0 status=none; done; }
verify() {   # threads -> seconds (the gate's own wall time)
    "$signer" verify --pubkey "$scratch/key.pub" "$scratch/manifest" --model "$model" --threads "$1" |
        sed -n 's/.*(\([0-9.]*\) s)$/\1/p'
}
drop
t_cold=$(verify "$threads")
t_warm=$(verify "$threads")
t_one=$(verify 1)
cold=$(rate "$bytes" "$t_cold"); warm=$(rate "$bytes" "$t_warm"); one=$(rate "$bytes" "$t_one")
created=$(rate "$bytes" "$t_create")

echo "disk read bound ($nfiles parallel O_DIRECT dd, 8M blocks): $disk GB/s"
echo "SHA-256 bound: $core GB/s per core x min($cores cores, $threads threads, $nfiles files) = $hashbound GB/s"
echo "verify cold (page cache dropped), $threads threads: $cold GB/s ($t_cold s)"
echo "verify warm, $threads threads: $warm GB/s ($t_warm s); 1 thread: $one GB/s"
echo "create (hash only, warm): $created GB/s"
gbs=$(awk -v b="$bytes" 'BEGIN{printf "%.2f", b/1e9}')
line="$(date -u +%Y-%m-%dT%H:%MZ) bench_manifest host=$(hostname) cores=$cores: $gbs GB, $threads threads:"
line="$line verify cold $cold GB/s vs disk $disk GB/s ($nfiles parallel O_DIRECT reads);"
line="$line warm $warm GB/s vs sha256 bound $hashbound GB/s = min(cores,threads,files)=$par"
line="$line ($core/core); 1 thread $one GB/s | cmd: bench/bench_manifest.sh $build${args:+ $args}"
echo "$line" >> bench/results.log
echo "appended to bench/results.log"
