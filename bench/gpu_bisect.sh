#!/usr/bin/env bash
# Decode steps of several commits side by side, in one device call: what
# found the 35B-A3B's loss in session 23's compiled-only commits (s25r2,
# docs/PERFORMANCE.md run 35), where one A/B per commit would have taken a
# device call each.
#
# Here (nvcc, no GPU):  bench/gpu_bisect.sh pack COMMIT... [-- CONFIG...]
#   builds bench_cuda at each COMMIT, in the order given, in one temporary
#   git worktree (each step recompiles only what that commit changed, so a
#   list of neighbouring commits builds in about half a minute each) and
#   packs them, with the shared libraries the GPU box lacks, into
#   .devcarry/bisect/ (git-ignored). CONFIGs default to the 35B-A3B and 27B
#   configs; CTX (default 4096) is the context of the steps.
# There (device tool, carry [".devcarry/bisect"]):  bench/gpu_bisect.sh run [ROUNDS]
#   for each config, ROUNDS (default 2) rounds of
#   `bench_cuda --config C --prefill CTX --decode 32 --ncu-decode --no-profile`
#   over the commits, every odd round in reverse order (so no commit always
#   runs first or last), then one line per config: each commit's ms per step,
#   round by round. Logs come back as $OUT/bisect.tar.xz, rewritten after each
#   config, so a run cut short still returns what it measured. About 16 s a
#   bench run on an H100, model set-up included.
set -u
cd "$(dirname "$0")/.."
. bench/gpu_common.sh
L=.devcarry/bisect
case "${1:-}" in
pack)
    set -e
    shift
    commits=() cfgs=()
    while [ $# -gt 0 ] && [ "$1" != -- ]; do commits+=("$1"); shift; done
    [ $# -gt 0 ] && shift
    cfgs=("$@")
    [ ${#commits[@]} -ge 2 ] || { echo "usage: bench/gpu_bisect.sh pack COMMIT COMMIT... [-- CONFIG...]" >&2; exit 2; }
    [ ${#cfgs[@]} -gt 0 ] || cfgs=(bench/configs/qwen3_5_35b_a3b.json bench/configs/qwen3_5_27b.json)
    names=() shas=()
    for c in "${commits[@]}"; do
        git rev-parse --verify -q "$c^{commit}" > /dev/null || { echo "pack: $c is not a commit" >&2; exit 2; }
        names+=("$(git rev-parse --short "$c")")
        shas+=("$(git rev-parse "$c^{commit}")") # a branch checked out here cannot be checked out in the worktree
    done
    rm -rf "${L:?}" && mkdir -p "$L/bin" "$L/lib"
    wt=$(mktemp -d /tmp/gpu_bisect.XXXXXX)
    git worktree add -q --detach "$wt" "${shas[0]}"
    trap 'git worktree remove --force "$wt"' EXIT
    for i in "${!commits[@]}"; do
        (cd "$wt" && git checkout -q "${shas[$i]}" && make -j2 build/libsanctum.a > /tmp/gpu_bisect_make.log 2>&1) ||
            { tail -20 /tmp/gpu_bisect_make.log; exit 1; }
        gpu_bench_cc "$wt" "$L/bin/bench_cuda_${names[$i]}"
        echo "built ${names[$i]}"
    done
    printf '%s\n' "${names[@]}" > "$L/commits"
    printf '%s\n' "${cfgs[@]}" > "$L/configs"
    echo "${CTX:-4096}" > "$L/ctx"
    gpu_pack_bins "$L"
    du -sh "$L"
    ;;
run)
    rounds=${2:-2}
    gpu_run_begin "$L" /tmp/gpu_bisect
    mapfile -t names < "$L/commits"
    ctx=$(cat "$L/ctx")
    n=${#names[@]}
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$w/env.log" 2>&1
    s=("$(cat "$w/env.log"), context $ctx, $rounds rounds")
    while read -r cfg; do
        name=$(basename "$cfg" .json)
        declare -A ms=()
        for ((r = 0; r < rounds; r++)); do
            for ((k = 0; k < n; k++)); do
                c=${names[$k]}
                [ $((r % 2)) -eq 1 ] && c=${names[$((n - 1 - k))]}
                log="$w/${name}_${c}_$r.log"
                gpu_decode "$B/bench_cuda_$c" "$cfg" "$ctx" 120 > "$log" 2>&1
                m=$(gpu_step_ms "$log")
                ms[$c]="${ms[$c]:-} ${m:-fail}"
            done
        done
        line="$name ms per step:"
        for c in "${names[@]}"; do line="$line $c${ms[$c]};"; done
        s+=("$line")
        unset ms
        printf '%s\n' "${s[@]}" > "$w/summary.log"
        (cd "$w" && tar cJf "$out/bisect.tar.xz" ./*.log)
    done < "$L/configs"
    echo "==== summary"
    printf '%s\n' "${s[@]}"
    rm -rf "${B:?}" # unpacked here only; the carry is bin.tar.xz
    ;;
*)
    echo "usage: bench/gpu_bisect.sh pack COMMIT... [-- CONFIG...] (here) | run [ROUNDS] (on the GPU box)" >&2
    exit 2
    ;;
esac
