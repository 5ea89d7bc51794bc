#!/usr/bin/env bash
# The CUDA helpers' one-call plans for the GPU box: nothing is built there.
#
# Here (a machine with nvcc):   bench/bench_cuda_gpu.sh pack [all|run|pcache]
#   builds every tests/test_cuda_*.c, bench_cuda, bench_pcache, bench_pld, sanctum-synth
#   and sanctum-run (into $BUILD, default build), and copies them with the
#   shared libraries the GPU box lacks into .devcarry/cuda/ (git-ignored);
#   "pack pcache" / "pack run" take only what that mode runs (the carry
#   limit is 64 MiB, ~8 MB a CUDA binary).
# There (through the device tool, carry [".devcarry/cuda"]), one mode a call:
#   bench/bench_cuda_gpu.sh run [quick]
#     test_cuda_ops, test_cuda_model, test_cuda_ops under compute-sanitizer
#     memcheck, and bench_cuda on the 35B-A3B and 27B configs.
#   bench/bench_cuda_gpu.sh pcache [quick]
#     issue 8 on the GPU: test_cuda_pcache (byte-identity cold/warm/PLD on
#     CUDA, and how many rows per forward give one-row bits), then writes the
#     ~1B synth model into /tmp and runs bench_pcache (TTFT, 2k shared
#     prefix, warm vs cold) and bench_pld (copy task on models/default,
#     nothing to copy on the 1B) on CUDA, and the same on the CPU for
#     comparison unless quick. Every step has a timeout and the whole mode
#     keeps under $SN_GPU_BUDGET_S s (default 540; run: 590), inside the
#     device tool's 10 minutes.
# Device time (2026-12-01): a call is charged about 60 s more than its wall
# time (machine start, transfers), and only 8 files come back from $OUT:
# tar the logs into one. A full record (every test, memcheck, both benches
# at 4096, pcache quick) runs in about 125 s of wall time.
# Logs go to $OUT (or ./gpu-out); a summary of every step is printed last,
# and one step failing never stops the others.
# Dry run of the pcache mode on a machine without a GPU (checks the script):
#   SN_GPU_BIN=build-x SN_GPU_BACKEND=cpu SN_GPU_1B_CONFIG=tiny.json SN_GPU_PREFIX=256 \
#   SN_GPU_WORK=/tmp/x OUT=/tmp/out bench/bench_cuda_gpu.sh pcache quick
# (SN_GPU_BIN a folder with the packed binaries' names, e.g. symlinks.)
set -u
cd "$(dirname "$0")/.."
mode=${1:-run}
B=${BUILD:-build}
PK=${PACK_DIR:-.devcarry/cuda}   # where pack puts, and the other modes find, binaries and libraries

if [ "$mode" = pack ]; then
    set -e
    # what a mode runs (pack pcache / pack run), or everything (default);
    # the carry limit is 64 MiB and each CUDA binary is ~8 MB
    what=${2:-all}
    bins=()
    [ "$what" != run ] && bins+=("$B/sanctum-synth" "$B/bench/bench_pcache" "$B/bench/bench_pld" "$B/tests/test_cuda_pcache")
    if [ "$what" != pcache ]; then
        for t in tests/test_cuda_*.c; do
            [ "$(basename "$t")" = test_cuda_pcache.c ] || bins+=("$B/tests/$(basename "$t" .c)")
        done
    fi
    [ "$what" = all ] && bins+=("$B/sanctum-run")
    make -j2 BUILD="$B" "$B/libsanctum.a" "${bins[@]}"
    cc -std=c17 -D_GNU_SOURCE -O2 -g -Wall -Wextra -Werror -Wno-unused-parameter -Iinclude -Isrc -pthread \
        -DSN_HAVE_CUDA=1 -o "$B/bench_cuda" bench/bench_cuda.c "$B/libsanctum.a" -lm -lpthread -ljansson \
        -L/usr/local/cuda/lib64 -L/usr/local/cuda/targets/x86_64-linux/lib -lcudart_static -lrt -lstdc++ -ldl
    # built with CUDA, or the GPU run would only SKIP
    strings "$B/libsanctum.a" | grep -q "built without CUDA" &&
        { echo "pack: $B was built without CUDA (SN_CUDA=0?): use another BUILD" >&2; exit 1; }
    rm -rf "$PK" && mkdir -p "$PK/bin" "$PK/lib"
    cp "${bins[@]}" "$PK/bin/"
    [ "$what" != pcache ] && cp "$B/bench_cuda" "$PK/bin/"
    strip "$PK"/bin/* || true
    # shared libraries other than glibc / libstdc++ / libgcc (the box has newer ones of those)
    for b in "$PK"/bin/*; do ldd "$b"; done | awk '/=> \//{print $3}' | sort -u |
        grep -v -E '/(libc|libm|libpthread|libdl|librt|libstdc\+\+|libgcc_s|ld-linux[^/]*)\.so' |
        while read -r l; do cp -L "$l" "$PK/lib/"; done
    ls "$PK/bin" "$PK/lib"
    du -sh "$PK"
    kb=$(du -sk "$PK" | cut -f1)
    [ "$kb" -gt 63000 ] && echo "pack: $PK is $kb KiB, over the device tool's 64 MiB carry: pack one mode (pack pcache / pack run)" >&2
    exit 0
fi

out=${OUT:-gpu-out}
mkdir -p "$out"
case "$PK" in /*) ;; *) PK="$PWD/$PK" ;; esac
export LD_LIBRARY_PATH="$PK/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
BIN=${SN_GPU_BIN:-$PK/bin}
quick=${2:-}
summary=()
add() { summary+=("$1"); }
start_all=$(date +%s)
default_budget=590; [ "$mode" = pcache ] && default_budget=540
budget=${SN_GPU_BUDGET_S:-$default_budget}
# step NAME LIMIT_S LOG CMD...: runs CMD under a timeout clipped to what is
# left of the budget, logs to $out/LOG, adds "NAME: rc, seconds, last line"
step() {
    local name=$1 lim=$2 log=$3; shift 3
    local left=$((budget - ($(date +%s) - start_all)))
    if [ "$left" -lt 10 ]; then add "$name: not run (budget of $budget s spent)"; return 1; fi
    [ "$lim" -gt "$left" ] && lim=$left
    local t0; t0=$(date +%s)
    echo "== $name (limit $lim s): $*" | tee -a "$out/commands.log"
    timeout -k 5 "$lim" "$@" >"$out/$log" 2>&1
    local rc=$?
    local why=""; [ $rc -eq 124 ] || [ $rc -eq 137 ] && why=" TIMEOUT"
    add "$name: rc=$rc$why ($(($(date +%s) - t0)) s): $(grep -v '^\s*$' "$out/$log" | tail -n 1 | cut -c1-400)"
    return $rc
}

nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total,clocks.sm,clocks.mem --format=csv 2>&1 |
    tee "$out/env.log"

if [ "$mode" = pcache ]; then
    work=${SN_GPU_WORK:-/tmp/sn_pcache_gpu}
    bk=${SN_GPU_BACKEND:-cuda}
    cfg1b=${SN_GPU_1B_CONFIG:-bench/bench_pcache_1b.json}
    prefix=${SN_GPU_PREFIX:-2048}
    mkdir -p "$work"
    step "test_cuda_pcache" 240 test_cuda_pcache.log $BIN/test_cuda_pcache
    grep -h "rows 1\.\.\|differs from one-row\|drafted\|FAIL\|SKIP\|resumed" "$out/test_cuda_pcache.log" | head -n 60 \
        >"$out/test_cuda_pcache.key.log"
    if [ -f "$work/tokenizer.json" ] || gzip -dc tests/fixtures/tokenizer/qwen3/tokenizer.json.gz >"$work/tokenizer.json"; then
        add "tokenizer: ok"
    else
        add "tokenizer: could not unpack tests/fixtures/tokenizer/qwen3/tokenizer.json.gz"
    fi
    have1b=0
    if [ -f "$work/1b/model.safetensors" ]; then
        have1b=1
    elif step "synth 1B" 200 synth_1b.log $BIN/sanctum-synth --config "$cfg1b" --out "$work/1b"; then
        have1b=1
    fi
    log="$out/results.log"
    if [ $have1b = 1 ]; then
        step "bench_pcache $bk ($prefix+32)" 120 bench_pcache_cuda.log $BIN/bench_pcache --backend "$bk" \
            --model "$work/1b" --tokenizer "$work/tokenizer.json" --prefix "$prefix" --tail 32 --reps 5 --log "$log"
        step "bench_pld $bk random 1B" 120 bench_pld_cuda_random.log $BIN/bench_pld --backend "$bk" \
            --model "$work/1b" --tokenizer "$work/tokenizer.json" --task random --n 2 --max-tokens 64 --reps 3 --log "$log"
    fi
    if [ -f models/default/config.json ]; then
        step "bench_pld $bk copy default" 90 bench_pld_cuda_copy.log $BIN/bench_pld --backend "$bk" \
            --model models/default --task copy --n 32 --words 8 --max-tokens 40 --reps 3 --log "$log"
        step "bench_pld $bk random default" 90 bench_pld_cuda_random_default.log $BIN/bench_pld --backend "$bk" \
            --model models/default --task random --n 8 --max-tokens 64 --reps 3 --log "$log"
        # what 8 verify rows would give, once the kernels are invariant to 8
        # (bench_pld refuses to time a run whose tokens differ from PLD off)
        step "bench_pld $bk copy default, 8 rows" 90 bench_pld_cuda_copy_inv8.log env SANCTUM_INVARIANT_ROWS=8 \
            $BIN/bench_pld --backend "$bk" --model models/default --task copy --n 32 --words 8 --max-tokens 40 \
            --reps 3 --log "$log"
    fi
    if [ "$quick" != quick ]; then
        th=$(nproc); [ "$th" -gt 16 ] && th=16
        [ -f models/default/config.json ] && step "bench_pld cpu copy default" 90 bench_pld_cpu_copy.log \
            $BIN/bench_pld --model models/default --task copy --n 16 --words 8 --max-tokens 40 --reps 2 \
            --threads "$th" --log "$log"
        [ $have1b = 1 ] && step "bench_pcache cpu ($prefix+32)" 150 bench_pcache_cpu.log $BIN/bench_pcache \
            --model "$work/1b" --tokenizer "$work/tokenizer.json" --prefix "$prefix" --tail 32 --reps 2 \
            --threads "$th" --log "$log"
    fi
    echo "================ summary (pcache, $(($(date +%s) - start_all)) s)"
    for l in "${summary[@]}"; do echo "$l"; done
    echo "---------------- test_cuda_pcache key lines"
    cat "$out/test_cuda_pcache.key.log"
    echo "---------------- result lines ($log)"
    [ -f "$log" ] && grep -h " bench_p" "$log" | sed 's/ | cmd:.*//' | cut -c1-700
    exit 0
fi

step "test_cuda_ops" 90 test_cuda_ops.log $BIN/test_cuda_ops
step "test_cuda_model" 90 test_cuda_model.log $BIN/test_cuda_model

san=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
if [ -n "$san" ] && [ "$quick" != quick ]; then
    step "memcheck test_cuda_ops" 90 memcheck.log env SANCTUM_CUDA_CUBLAS=0 "$san" --tool memcheck --leak-check no \
        --error-exitcode 9 $BIN/test_cuda_ops
    add "memcheck: $(grep -c 'Invalid\|ERROR SUMMARY: [1-9]' "$out/memcheck.log") error lines, $(grep 'ERROR SUMMARY' "$out/memcheck.log" | tail -n 1)"
fi

for cfg in qwen3_5_35b_a3b qwen3_5_27b; do
    args=(--config "bench/configs/$cfg.json" --prefill 4096 --decode 64 --log "$out/results.log")
    [ "$quick" = quick ] && args=(--config "bench/configs/$cfg.json" --prefill 512 --decode 32 --layers 8 --log "$out/results.log")
    step "bench $cfg" 150 "bench_$cfg.log" $BIN/bench_cuda "${args[@]}"
    add "  $cfg: $(grep -E 'decode \(graph\)|prefill [0-9]+ tokens' "$out/bench_$cfg.log" | tr -s ' ' | tr '\n' ';')"
done

echo "================ summary"
for l in "${summary[@]}"; do echo "$l"; done
grep -h "FAIL\|not ok\|SKIP" "$out"/test_cuda_*.log | head -n 20
