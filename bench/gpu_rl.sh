#!/usr/bin/env bash
# The register-load GEMV (tune gemv_rl) on the GPU in one device call, on
# the binaries of bench/gpu_record.sh pack (.devcarry/lead): test_cuda_ops
# (its test_gemv_rl: the ring form's bits), then on the 27B and 35B-A3B at
# 4096 context, three interleaved rounds of the default (gemv_rl=3: form 1
# over 4096 columns, the ring below) against gemv_rl=0 (the ring
# everywhere), 1 and 2 (the two load forms everywhere), gemv_i8=0 (down/out on the SIMT GEMV too),
# that with each load form, gemv_rl=1 without the pool (gemv_dyn=0) and at
# two rows a warp (gemv_rpw=2: 97 registers instead of 128);
# then on the 27B one step's kernel timeline (CUPTI) under each form, and
# ncu on layer 0's qkv (conv folded) and gate/up (pooled) launches under
# each: duration, DRAM throughput, active warps and where the warps stall.
# The logs come back as $OUT/rl.tar.xz (about 5 minutes on an H100).
#   There (device tool, carry [".devcarry/lead"]):  bench/gpu_rl.sh
set -u
cd "$(dirname "$0")/.."
. bench/gpu_common.sh
gpu_run_begin .devcarry/lead /tmp/gpu_rl
# the logs so far into $OUT (rewritten after each step: a call cut short keeps them)
keep_logs() { (cd "$w" && tar cJf "${OUT:-/tmp/out}/rl.tar.xz" ./*.log); }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader > "$w/env.log" 2>&1
cat "$w/env.log"
t0=$SECONDS
timeout 200 "$B/test_cuda_ops" > "$w/ops.log" 2>&1
echo "test_cuda_ops rc $? ($((SECONDS - t0)) s): $(grep -E '^[0-9]+ passed' "$w/ops.log" | tail -n1)"
grep -E 'FAIL|differ' "$w/ops.log" | head -20
for m in qwen3_5_27b qwen3_5_35b_a3b; do
    t0=$SECONDS
    gpu_decode "$B/bench_cuda" "bench/configs/$m.json" 4096 240 --vary gemv_rl=0:3 --vary gemv_rl=1:3 \
        --vary gemv_rl=2:3 --vary gemv_i8=0:1 --vary gemv_rl=1:3,gemv_i8=0:1 --vary gemv_rl=2:3,gemv_i8=0:1 \
        --vary gemv_rl=1:3,gemv_dyn=0:50 --vary gemv_rl=1:3,gemv_rpw=2:0 > "$w/$m.log" 2>&1
    echo "$m (rc $?, $((SECONDS - t0)) s)"
    gpu_rounds "$w/$m.log"
    keep_logs
done
cfg=bench/configs/qwen3_5_27b.json
for rl in 0 1 2; do
    t0=$SECONDS
    timeout 120 "$B/bench_cuda" --config $cfg --prefill 4096 --decode 16 --ncu-decode --no-profile --timeline \
        --tune gemv_rl=$rl > "$w/timeline_rl$rl.log" 2>&1
    echo "timeline gemv_rl=$rl (rc $?, $((SECONDS - t0)) s)"
    sed -n '/^  timeline/,/in stream order/p' "$w/timeline_rl$rl.log" | grep -v "in stream order" | head -16 |
        sed -E 's/ +/ /g'
done
keep_logs
command -v ncu > /dev/null || exit 0
m=gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active
for r in long_scoreboard barrier short_scoreboard mio_throttle lg_throttle wait not_selected selected no_instruction \
    math_pipe_throttle; do m+=",smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio"; done
for rl in 0 1 2; do
    t0=$SECONDS
    timeout 150 ncu --profile-from-start off --graph-profiling node -k regex:k_gemv --launch-count 2 --metrics "$m" \
        "$B/bench_cuda" --config $cfg --prefill 64 --decode 4 --ncu-decode --no-profile --tune gemv_rl=$rl \
        > "$w/ncu_rl$rl.log" 2>&1
    echo "ncu gemv_rl=$rl, layer 0's qkv then gate/up (rc $?, $((SECONDS - t0)) s)"
    grep -E "k_gemv|duration|throughput|warps_active|stalled" "$w/ncu_rl$rl.log" |
        sed -E 's/smsp__average_warps_issue_stalled_//; s/_per_issue_active.ratio//; s/ +/ /g' | head -32
    keep_logs
done
