#!/usr/bin/env bash
# A change against a base commit on the GPU, in one device call: the CUDA
# tests of the change, then decode steps of both binaries alternated round
# by round (machines of one kind differ by a few percent from call to call,
# so only an interleaved comparison in one call says anything).
#
# Here (nvcc, no GPU):  bench/gpu_ab.sh pack BASE [CONFIG...]
#   builds this tree's CUDA tests and bench_cuda, and bench_cuda of commit
#   BASE in a temporary git worktree, and packs them with the shared
#   libraries the GPU box lacks into .devcarry/ab/ (git-ignored). CONFIGs
#   (default: the 35B-A3B and 27B configs) are remembered for run.
# There (device tool, carry [".devcarry/ab"]):  bench/gpu_ab.sh run [ROUNDS]
#   test_cuda_ops, test_cuda_model, test_cuda_moe, test_cuda_gemm_i8 of the
#   change, then for each config ROUNDS (default 3) rounds of
#   `bench_cuda --config C --prefill CTX --decode 32 --ncu-decode --no-profile`,
#   base and change alternating (which goes first alternates too), and a
#   summary: every round's ms per step and the medians. CTX at pack (default
#   1024; the records use 4096, where the decode attention weighs more) is
#   the context the steps run at. ROWS at pack (e.g.
#   ROWS="1 6") times those rows a step (`--rows`: prompt-lookup verify
#   passes) too; default 1. With VARY set at
#   pack (e.g. VARY="moe_pre=0:3 gemv_pre=8:1"), the change's binary
#   then runs `--vary` of each (tune keys, three interleaved rounds) on each
#   config as well. Logs come back as $OUT/ab.tar.xz. About 10 s a bench run
#   on the H200, plus start-up.
set -u
cd "$(dirname "$0")/.."
. bench/gpu_common.sh
L=.devcarry/ab
case "${1:-}" in
pack)
    set -e
    base=${2:?usage: bench/gpu_ab.sh pack BASE [CONFIG...]}
    shift 2
    cfgs=("$@")
    [ ${#cfgs[@]} -gt 0 ] || cfgs=(bench/configs/qwen3_5_35b_a3b.json bench/configs/qwen3_5_27b.json)
    git rev-parse --verify -q "$base^{commit}" > /dev/null || { echo "pack: $base is not a commit" >&2; exit 2; }
    rm -rf "${L:?}" && mkdir -p "$L/bin" "$L/lib"
    tests=(test_cuda_ops test_cuda_model test_cuda_moe test_cuda_gemm_i8 test_cuda_prefill)
    make -j2 build/libsanctum.a "${tests[@]/#/build/tests/}" > /tmp/gpu_ab_make.log 2>&1 ||
        { tail -20 /tmp/gpu_ab_make.log; exit 1; }
    gpu_bench_cc . "$L/bin/bench_cuda"
    for t in "${tests[@]}"; do cp "build/tests/$t" "$L/bin/"; done
    wt=$(mktemp -d /tmp/gpu_ab_base.XXXXXX)
    git worktree add -q --detach "$wt" "$base"
    (cd "$wt" && make -j2 build/libsanctum.a > /tmp/gpu_ab_make_base.log 2>&1) ||
        { tail -20 /tmp/gpu_ab_make_base.log; git worktree remove --force "$wt"; exit 1; }
    gpu_bench_cc "$wt" "$L/bin/bench_cuda_base"
    git worktree remove --force "$wt"
    printf '%s\n' "${cfgs[@]}" > "$L/configs"
    echo "${ROWS:-1}" > "$L/rows"
    echo "${CTX:-1024}" > "$L/ctx"
    : > "$L/vary"
    [ -z "${VARY:-}" ] || printf '%s\n' $VARY > "$L/vary"
    { echo "change: $(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo '+uncommitted')"
      echo "base: $(git rev-parse --short "$base")"; } > "$L/commits"
    gpu_pack_bins "$L"
    cat "$L/commits"
    du -sh "$L"
    ;;
run)
    rounds=${2:-3}
    gpu_run_begin "$L" /tmp/gpu_ab
    cat "$L/commits" | tee "$w/commits.log"
    s=()
    for t in test_cuda_ops test_cuda_model test_cuda_moe test_cuda_gemm_i8; do
        timeout 150 "$B/$t" > "$w/$t.log" 2>&1
        s+=("$t rc=$? $(grep -E '^[0-9]+ passed' "$w/$t.log" | tail -n1)")
    done
    grep -h FAIL "$w"/test_cuda_*.log | head -10
    read -r -a rows_list < "$L/rows"
    ctx=$(cat "$L/ctx" 2> /dev/null || echo 1024)
    echo "context: $ctx" | tee -a "$w/commits.log"
    while read -r cfg; do
      for nr in "${rows_list[@]}"; do
        name=$(basename "$cfg" .json)
        rarg=()
        if [ "$nr" -gt 1 ]; then name="${name}_rows$nr"; rarg=(--rows "$nr"); fi
        base_ms=() new_ms=()
        for ((r = 0; r < rounds; r++)); do
            order=(base new)
            [ $((r % 2)) -eq 1 ] && order=(new base)
            for who in "${order[@]}"; do
                bin=$B/bench_cuda
                [ "$who" = base ] && bin=$B/bench_cuda_base
                log="$w/${name}_${who}_$r.log"
                gpu_decode "$bin" "$cfg" "$ctx" 120 "${rarg[@]}" > "$log" 2>&1
                ms=$(gpu_step_ms "$log")
                if [ "$who" = base ]; then base_ms+=("${ms:-fail}"); else new_ms+=("${ms:-fail}"); fi
            done
        done
        med() { printf '%s\n' "$@" | grep -v fail | sort -n | awk '{a[NR]=$1} END {if (NR) print a[int((NR+1)/2)]; else print "none"}'; }
        s+=("$name ms per step: change ${new_ms[*]} (median $(med "${new_ms[@]}")), base ${base_ms[*]} (median $(med "${base_ms[@]}"))")
      done
    done < "$L/configs"
    if [ -s "$L/vary" ]; then
        gpu_vary_args "$L/vary"
        while read -r cfg; do
            name=$(basename "$cfg" .json)
            gpu_decode "$B/bench_cuda" "$cfg" "$ctx" 200 "${va[@]}" > "$w/${name}_vary.log" 2>&1
            s+=("$name --vary (change's binary), ms per step:")
            while read -r l; do s+=("  $l"); done < <(gpu_rounds "$w/${name}_vary.log")
        done < "$L/configs"
    fi
    echo "==== summary"
    printf '%s\n' "${s[@]}" | tee "$w/summary.log"
    (cd "$w" && tar cJf "$out/ab.tar.xz" ./*.log)
    rm -rf "${B:?}" # unpacked here only; the carry is bin.tar.xz
    ;;
*)
    echo "usage: bench/gpu_ab.sh pack BASE [CONFIG...] (here) | run [ROUNDS] (on the GPU box)" >&2
    exit 2
    ;;
esac
