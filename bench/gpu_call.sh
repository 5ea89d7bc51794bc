#!/usr/bin/env bash
# One device call that is useful on whichever card comes (the device tool
# lends H100s and H200s call by call, and often neither): main's decode and
# prefill lines at 4096 tokens from the record pack (bench/gpu_record.sh pack:
# .devcarry/lead) and the A/B pack's tests and rounds (bench/gpu_ab.sh pack:
# .devcarry/ab). On an H200 the lines run first (the targets are set there
# and no H200 record has run since run 32); on an H100 the A/B runs first.
# Everything is appended to $OUT/call.log as it comes, so a call cut short
# still brings back what ran.
#
# There (device tool, carry [".devcarry/ab", ".devcarry/lead"], ~300 s on
# an H100):  bench/gpu_call.sh
set -u
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/out}
mkdir -p "$out"
gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)
echo "$gpu" | tee "$out/call.log"
. bench/gpu_common.sh
lines() {
    (
        gpu_unpack .devcarry/lead
        for cfg in qwen3_5_35b_a3b qwen3_5_27b; do
            timeout 150 .devcarry/lead/bin/bench_cuda --config "bench/configs/$cfg.json" --prefill 4096 --decode 64 \
                --log "$out/results.log" > "$out/bench_$cfg.log" 2>&1
            echo "bench $cfg rc=$?" | tee -a "$out/call.log"
            grep -h "decode (graph\|prefill 4096 tokens (default\|GPU memory" "$out/bench_$cfg.log" | tee -a "$out/call.log"
        done
    )
}
ab() { bench/gpu_ab.sh run 1 2>&1 | tail -45 | tee -a "$out/call.log"; }
case "$gpu" in
*H200*) lines; ab ;;
*) ab; lines ;;
esac
