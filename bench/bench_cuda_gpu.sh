#!/usr/bin/env bash
# The CUDA helper's one-call plan for the GPU box: nothing is built there.
#
# Here (a machine with nvcc):   bench/bench_cuda_gpu.sh pack
#   builds the CUDA tests and bench_cuda, and copies them with the shared
#   libraries the GPU box lacks into .devcarry/cuda/ (git-ignored).
# There (through the device tool, carry [".devcarry/cuda"]):
#   bench/bench_cuda_gpu.sh run [quick]
#   runs test_cuda_ops, test_cuda_model, test_cuda_ops under
#   compute-sanitizer memcheck, and bench_cuda on the 35B-A3B and 27B
#   configs; logs go to $OUT (or ./gpu-out), a short table is printed last.
set -u
cd "$(dirname "$0")/.."
mode=${1:-run}

if [ "$mode" = pack ]; then
    set -e
    make -j2 build/libsanctum.a build/tests/test_cuda_ops build/tests/test_cuda_model build/sanctum-run \
        build/tests/test_cuda_prefill
    cc -std=c17 -D_GNU_SOURCE -O2 -g -Wall -Wextra -Werror -Wno-unused-parameter -Iinclude -Isrc -pthread \
        -DSN_HAVE_CUDA=1 -o build/bench_cuda bench/bench_cuda.c build/libsanctum.a -lm -lpthread -ljansson \
        -L/usr/local/cuda/lib64 -L/usr/local/cuda/targets/x86_64-linux/lib -lcudart_static -lrt -lstdc++ -ldl
    rm -rf .devcarry/cuda && mkdir -p .devcarry/cuda/bin .devcarry/cuda/lib
    cp build/tests/test_cuda_ops build/tests/test_cuda_model build/bench_cuda build/sanctum-run \
        build/tests/test_cuda_prefill .devcarry/cuda/bin/
    strip .devcarry/cuda/bin/* || true
    # shared libraries other than glibc / libstdc++ / libgcc (the box has newer ones of those)
    for b in .devcarry/cuda/bin/*; do ldd "$b"; done | awk '/=> \//{print $3}' | sort -u |
        grep -v -E '/(libc|libm|libpthread|libdl|librt|libstdc\+\+|libgcc_s|ld-linux[^/]*)\.so' |
        while read -r l; do cp -L "$l" .devcarry/cuda/lib/; done
    du -sh .devcarry/cuda
    exit 0
fi

out=${OUT:-gpu-out}
mkdir -p "$out"
export LD_LIBRARY_PATH="$PWD/.devcarry/cuda/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
BIN=.devcarry/cuda/bin
quick=${2:-}
summary=()
add() { summary+=("$1"); }

nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total,clocks.sm,clocks.mem --format=csv 2>&1 |
    tee "$out/env.log"

t0=$(date +%s)
timeout 90 $BIN/test_cuda_ops >"$out/test_cuda_ops.log" 2>&1
add "test_cuda_ops: $(tail -n 1 "$out/test_cuda_ops.log") ($(($(date +%s) - t0)) s)"
t0=$(date +%s)
timeout 90 $BIN/test_cuda_model >"$out/test_cuda_model.log" 2>&1
add "test_cuda_model: $(tail -n 1 "$out/test_cuda_model.log") ($(($(date +%s) - t0)) s)"

san=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
if [ -n "$san" ] && [ "$quick" != quick ]; then
    t0=$(date +%s)
    SANCTUM_CUDA_CUBLAS=0 timeout 90 "$san" --tool memcheck --leak-check no --error-exitcode 9 $BIN/test_cuda_ops >"$out/memcheck.log" 2>&1
    rc=$?
    add "memcheck test_cuda_ops: rc=$rc, $(grep -c 'Invalid\|ERROR SUMMARY: [1-9]' "$out/memcheck.log") error lines, $(grep 'ERROR SUMMARY' "$out/memcheck.log" | tail -n 1) ($(($(date +%s) - t0)) s)"
fi

for cfg in qwen3_5_35b_a3b qwen3_5_27b; do
    t0=$(date +%s)
    args=(--config "bench/configs/$cfg.json" --prefill 4096 --decode 64 --log "$out/results.log")
    [ "$quick" = quick ] && args=(--config "bench/configs/$cfg.json" --prefill 512 --decode 32 --layers 8 --log "$out/results.log")
    timeout 150 $BIN/bench_cuda "${args[@]}" >"$out/bench_$cfg.log" 2>&1
    add "bench $cfg rc=$? ($(($(date +%s) - t0)) s): $(grep -E 'decode \(graph\)|prefill [0-9]+ tokens' "$out/bench_$cfg.log" | tr -s ' ' | tr '\n' ';')"
done

echo "================ summary"
for l in "${summary[@]}"; do echo "$l"; done
grep -h "FAIL\|not ok\|SKIP" "$out"/test_cuda_*.log | head -n 20
