#!/usr/bin/env bash
# The register-load GEMV (tune gemv_rl) on the GPU in one device call, on
# the binaries of bench/gpu_record.sh pack (.devcarry/lead): test_cuda_ops
# (its test_gemv_rl: the ring form's bits), then on the 27B and 35B-A3B at
# 4096 context, three interleaved rounds of the default against gemv_rl=1
# and 2 (the two load forms), gemv_i8=0 (down/out on the SIMT GEMV too),
# that with each load form, and gemv_rl=1 without the pool (gemv_dyn=0).
# The logs come back as $OUT/rl.tar.xz.
#   There (device tool, carry [".devcarry/lead"]):  bench/gpu_rl.sh
set -u
cd "$(dirname "$0")/.."
. bench/gpu_common.sh
gpu_run_begin .devcarry/lead /tmp/gpu_rl
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader > "$w/env.log" 2>&1
cat "$w/env.log"
t0=$SECONDS
timeout 200 "$B/test_cuda_ops" > "$w/ops.log" 2>&1
echo "test_cuda_ops rc $? ($((SECONDS - t0)) s): $(grep -E '^[0-9]+ passed' "$w/ops.log" | tail -n1)"
grep -E 'FAIL|differ' "$w/ops.log" | head -20
for m in qwen3_5_27b qwen3_5_35b_a3b; do
    t0=$SECONDS
    gpu_decode "$B/bench_cuda" "bench/configs/$m.json" 4096 240 --vary gemv_rl=1:0 --vary gemv_rl=2:0 \
        --vary gemv_i8=0:1 --vary gemv_rl=1:0,gemv_i8=0:1 --vary gemv_rl=2:0,gemv_i8=0:1 \
        --vary gemv_rl=1:0,gemv_dyn=0:50 > "$w/$m.log" 2>&1
    echo "$m (rc $?, $((SECONDS - t0)) s)"
    gpu_rounds "$w/$m.log"
    (cd "$w" && tar cJf "${OUT:-/tmp/out}/rl.tar.xz" ./*.log)
done
