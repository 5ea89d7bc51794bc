#!/usr/bin/env bash
# One device call that is useful on whichever card comes (the device tool
# lends H100s and H200s call by call, and often neither), from two packs made
# here: the record pack (bench/gpu_record.sh pack: .devcarry/lead) and the A/B
# pack (bench/gpu_ab.sh pack: .devcarry/ab, whose VARY and CTX it uses).
# Steps, most important first:
#   gemm   the change's test_cuda_gemm_i8 with each prefill GEMM form timed
#          alone on the 27B's shapes (SANCTUM_TEST_GEMM_I8_TIME=1; half a
#          minute); if it fails, the lines leave the hi/lo prefill out
#   i8     the change's test_cuda_model and test_cuda_prefill with
#          SANCTUM_CUDA_GEMM=i8 (the 3 digits; hi/lo is the default)
#   lines  main's bench_cuda lines for both models at 4096 tokens (lead pack);
#          on an H200 right after gemm (the targets are set there), last on
#          an H100
#   ops    the change's test_cuda_ops (A/B pack)
#   vary   the change's bench_cuda --vary of every VARY entry, per A/B config
#   tests  the change's test_cuda_model, test_cuda_prefill, test_cuda_moe
#   prof   ncu sections of the 3-digit and hi/lo prefill GEMMs
# and first of all, when carried, build/mma_f16_probe (bench/mma_f16_probe.cu,
# under a second).
# Each step writes its own log under $OUT as it runs and call.log gets the
# summary lines, so a call cut short by its limit still brings back every
# step that finished. For the full interleaved base/change rounds use
# bench/gpu_ab.sh run instead.
#
# There (device tool, carry [".devcarry/ab", ".devcarry/lead"] and, for the
# probe, "build/mma_f16_probe"; ~200 s on an H100):  bench/gpu_call.sh
set -u
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/out}
mkdir -p "$out"
gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)
echo "$gpu" | tee "$out/call.log"
. bench/gpu_common.sh
gpu_unpack .devcarry/lead
gpu_unpack .devcarry/ab
export LD_LIBRARY_PATH=$PWD/.devcarry/ab/lib:$PWD/.devcarry/lead/lib
A=.devcarry/ab/bin L=.devcarry/lead/bin
ctx=$(cat .devcarry/ab/ctx 2> /dev/null || echo 4096)
lines() {
    for cfg in qwen3_5_35b_a3b qwen3_5_27b; do
        timeout 150 "$L/bench_cuda" --config "bench/configs/$cfg.json" --prefill 4096 --decode 64 \
            --log "$out/results.log" > "$out/bench_$cfg.log" 2>&1
        echo "lines $cfg rc=$?" | tee -a "$out/call.log"
        grep -h "decode (graph\|step split\|prefill 4096 tokens (default\|hilo\|GPU memory" "$out/bench_$cfg.log" | tee -a "$out/call.log"
    done
}
tst() {
    timeout 150 "$A/$1" > "$out/$1.log" 2>&1
    echo "$1 rc=$? $(grep -E '^[0-9]+ passed' "$out/$1.log" | tail -n1)" | tee -a "$out/call.log"
    grep -h FAIL "$out/$1.log" | head -5 | tee -a "$out/call.log"
}
# the prefill GEMMs: correctness, then each form timed alone on the 27B's shapes at T = 4096
gemm() {
    SANCTUM_TEST_GEMM_I8_TIME=1 timeout 200 "$A/test_cuda_gemm_i8" > "$out/test_cuda_gemm_i8.log" 2>&1
    local rc=$?
    # the lines then leave the hi/lo prefill out, and prefill on 3 digits by default
    [ $rc -eq 0 ] || export SANCTUM_BENCH_HILO=0 SANCTUM_CUDA_GEMM=i8
    echo "test_cuda_gemm_i8 rc=$rc $(grep -E '^[0-9]+ passed' "$out/test_cuda_gemm_i8.log" | tail -n1)" |
        tee -a "$out/call.log"
    grep -h "FAIL\|vs scalar cpu\|emulated vs\|  time " "$out/test_cuda_gemm_i8.log" | head -20 | tee -a "$out/call.log"
}
vary() {
    gpu_vary_args .devcarry/ab/vary
    [ ${#va[@]} -gt 0 ] || return 0
    while read -r cfg; do
        name=$(basename "$cfg" .json)
        gpu_decode "$A/bench_cuda" "$cfg" "$ctx" 200 "${va[@]}" > "$out/vary_$name.log" 2>&1
        echo "vary $name rc=$?" | tee -a "$out/call.log"
        gpu_rounds "$out/vary_$name.log" | tee -a "$out/call.log"
    done < .devcarry/ab/configs
}
if [ -x build/mma_f16_probe ]; then
    timeout 60 build/mma_f16_probe > "$out/mma_f16_probe.log" 2>&1
    echo "mma_f16_probe rc=$?" | tee -a "$out/call.log"
    tee -a "$out/call.log" < "$out/mma_f16_probe.log"
fi
gemm
# the model fixtures and the prefill tests with the 3-digit GEMM for every dense prefill matmul (the hi/lo
# form is the default since s38r1; the later steps run it)
i8_models() {
    local t
    for t in test_cuda_model test_cuda_prefill; do
        [ -x "$A/$t" ] || continue
        SANCTUM_CUDA_GEMM=i8 timeout 150 "$A/$t" > "$out/${t}_i8.log" 2>&1
        echo "$t (SANCTUM_CUDA_GEMM=i8) rc=$? $(grep -E '^[0-9]+ passed' "$out/${t}_i8.log" | tail -n1)" |
            tee -a "$out/call.log"
        grep -h FAIL "$out/${t}_i8.log" | head -5 | tee -a "$out/call.log"
    done
}
i8_models
case "$gpu" in *H200*) lines ;; esac
tst test_cuda_ops
vary
for t in test_cuda_model test_cuda_prefill test_cuda_moe; do tst "$t"; done
# last: ncu on the 3-digit and hi/lo GEMMs (17408 x 5120 at T = 4096, the timing's first shape, its second
# launch) for where each one's time goes
# (the hi/lo kernel's launches: 1 warm-up + 10 timed with warps of 64 rows, then the same with 32)
prof() {
    local k skip
    for k in k_gemm_i8:1 k_gemm_hl:1 k_gemm_hl:12; do
        skip=${k#*:} k=${k%:*}
        SANCTUM_TEST_GEMM_I8_TIME=only timeout 120 ncu -k "regex:$k" --launch-skip "$skip" --launch-count 1 \
            --section SpeedOfLight --section ComputeWorkloadAnalysis --section Occupancy --section WarpStateStats \
            --section LaunchStats "$A/test_cuda_gemm_i8" > "$out/ncu_${k}_$skip.log" 2>&1
        echo "ncu $k (launch $skip) rc=$?" | tee -a "$out/call.log"
        grep -E "Duration|Executed Ipc A|Issue Slots Busy|Compute \(SM\) Throughput|Registers Per|Achieved Occ|Stall" \
            "$out/ncu_${k}_$skip.log" | head -12 | tee -a "$out/call.log"
    done
    # where the 8-warp hi/lo kernel's warps wait: cycles per issued instruction by stall reason
    local m=smsp__average_warps_issue_stalled r
    local ms=""
    for r in barrier long_scoreboard short_scoreboard mio_throttle math_pipe_throttle wait not_selected selected \
        dispatch_stall lg_throttle no_instruction branch_resolving; do ms+="${ms:+,}${m}_${r}_per_issue_active.ratio"; done
    SANCTUM_TEST_GEMM_I8_TIME=only timeout 120 ncu -k regex:k_gemm_hl --launch-skip 1 --launch-count 1 --metrics "$ms" \
        "$A/test_cuda_gemm_i8" > "$out/ncu_stalls_hl.log" 2>&1
    echo "ncu stalls k_gemm_hl rc=$?" | tee -a "$out/call.log"
    grep -E "stalled" "$out/ncu_stalls_hl.log" | sed 's/smsp__average_warps_issue_stalled_//' | tee -a "$out/call.log"
}
command -v ncu > /dev/null && prof
case "$gpu" in *H200*) ;; *) lines ;; esac
