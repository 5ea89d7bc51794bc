#!/usr/bin/env bash
# Tune knobs timed on the GPU in one device call, on the binaries of
# bench/gpu_record.sh pack (.devcarry/lead): what run 36 left open went
# through it.
#
# There (device tool, carry [".devcarry/lead"]):
#   bench/gpu_vary.sh NAME,CONFIG,CTX,KEY=VALUE:RESTORE[,KEY=VALUE:RESTORE...] ...
# each argument runs `bench_cuda --config CONFIG --prefill CTX --decode 32
# --ncu-decode --no-profile --vary ...` (three interleaved rounds of the
# default and each variant, ms per step); among the KEY=VALUE:RESTORE
# items, KEY=VALUE (no colon) sets the baseline (--tune), rows=N makes
# the steps N-row verify passes (--rows) and timeline adds the baseline's
# kernel timeline (--timeline; its table by exposed time goes into the
# summary, the per-kernel list stays in the log); the rounds are printed as they
# come and the logs return as $OUT/vary.tar.xz, rewritten after each
# argument, so a call cut short keeps what it measured.
#   e.g. bench/gpu_vary.sh 35b,bench/configs/qwen3_5_35b_a3b.json,4096,fuse_attn_prep=1:0 \
#        default,models/default/config.json,1024,pdl_min_kb=0:2048
set -u
cd "$(dirname "$0")/.."
. bench/gpu_common.sh
usage() { awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$0" >&2; exit 2; }
[ $# -gt 0 ] || usage
for spec in "$@"; do # every argument checked before the pack is unpacked
    IFS=, read -r -a f <<< "$spec"
    [ ${#f[@]} -ge 4 ] && [ -n "${f[0]}" ] && [ -f "${f[1]}" ] && [[ ${f[2]} =~ ^[1-9][0-9]*$ ]] || {
        echo "gpu_vary.sh: '$spec': want NAME,CONFIG,CTX,KEY=VALUE:RESTORE... (an existing config, CTX >= 1)" >&2
        usage
    }
done
gpu_run_begin .devcarry/lead /tmp/gpu_vary
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$w/env.log" 2>&1
s=("$(cat "$w/env.log")")
for spec in "$@"; do
    IFS=, read -r -a f <<< "$spec"
    name=${f[0]} cfg=${f[1]} ctx=${f[2]}
    va=()
    for v in "${f[@]:3}"; do
        case $v in
        rows=[1-8]) va+=(--rows "${v#rows=}") ;; # the steps carry N rows (a verify pass)
        timeline) va+=(--timeline) ;;            # and one step's kernel timeline (CUPTI) in the log
        *:*) va+=(--vary "$v") ;;
        *) va+=(--tune "$v") ;; # the baseline's setting
        esac
    done
    t0=$SECONDS
    gpu_decode "$B/bench_cuda" "$cfg" "$ctx" 240 "${va[@]}" > "$w/$name.log" 2>&1
    s+=("$name (rc $?, $((SECONDS - t0)) s): $cfg at $ctx")
    while read -r l; do s+=("  $l"); done < <(gpu_rounds "$w/$name.log")
    while read -r l; do s+=("  $l"); done < <(sed -n '/^  timeline/,/in stream order/p' "$w/$name.log" |
        grep -v "in stream order" | head -40 | sed -E 's/ +/ /g')
    printf '%s\n' "${s[@]}" | tee "$w/summary.log" | tail -n +2 | sed -n "/^$name /,\$p"
    (cd "$w" && tar cJf "$out/vary.tar.xz" ./*.log)
done
