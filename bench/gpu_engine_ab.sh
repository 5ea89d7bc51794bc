#!/usr/bin/env bash
# An environment knob's effect on generation through the engine (sn_generate,
# the loop the server runs), in one device call: bench_pld's greedy decode
# (without and with prompt lookup) on models/default and on a synthesized 1B
# of the real Qwen3 vocabulary, the knob at 0 and at 1 alternated round by
# round (which goes first alternates too).
#
# Here (nvcc, no GPU):  bench/gpu_engine_ab.sh pack
#   builds bench_pld and sanctum-synth of this tree into .devcarry/engine/
#   (git-ignored) with the shared libraries the GPU box lacks.
# There (device tool, carry [".devcarry/engine"]):
#   KNOB=SANCTUM_RECORD_AHEAD bench/gpu_engine_ab.sh run [ROUNDS]
#   (ROUNDS default 3; about 15 s a round on an H100). Logs come back as
#   $OUT/engine_ab.tar.xz; the summary lists every round's decode tok/s.
set -u
cd "$(dirname "$0")/.."
. bench/gpu_common.sh
L=.devcarry/engine
case "${1:-}" in
pack)
    set -e
    make -j2 build/bench/bench_pld build/sanctum-synth > /tmp/gpu_engine_make.log 2>&1 ||
        { tail -20 /tmp/gpu_engine_make.log; exit 1; }
    rm -rf "${L:?}" && mkdir -p "$L/bin" "$L/lib"
    cp build/bench/bench_pld build/sanctum-synth "$L/bin/"
    echo "$(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo '+uncommitted')" > "$L/commit"
    gpu_pack_bins "$L"
    du -sh "$L"
    ;;
run)
    knob=${KNOB:?set KNOB to the environment variable to alternate}
    rounds=${2:-3}
    gpu_run_begin "$L" /tmp/gpu_engine_ab
    echo "commit $(cat "$L/commit"), $knob 0 vs 1" | tee "$w/commit.log"
    gzip -dc tests/fixtures/tokenizer/qwen3/tokenizer.json.gz > "$w/tokenizer.json"
    timeout 200 "$B/sanctum-synth" --config bench/bench_pcache_1b.json --out "$w/1b" > "$w/synth.log" 2>&1 ||
        echo "synth 1B failed: $(tail -1 "$w/synth.log")"
    s=()
    for ((r = 0; r < rounds; r++)); do
        order=(0 1)
        [ $((r % 2)) -eq 1 ] && order=(1 0)
        for v in "${order[@]}"; do
            log="$w/default_${v}_$r.log"
            env "$knob=$v" timeout 120 "$B/bench_pld" --backend cuda --model models/default --task random --n 8 \
                --max-tokens 64 --reps 3 > "$log" 2>&1
            s+=("default $knob=$v round $r rc=$? $(grep -oE 'decode [0-9.]+ tok/s without PLD, [0-9.]+ with' "$log")")
            if [ -f "$w/1b/config.json" ]; then
                log="$w/1b_${v}_$r.log"
                env "$knob=$v" timeout 120 "$B/bench_pld" --backend cuda --model "$w/1b" \
                    --tokenizer "$w/tokenizer.json" --task random --n 2 --max-tokens 64 --reps 3 > "$log" 2>&1
                s+=("1b $knob=$v round $r rc=$? $(grep -oE 'decode [0-9.]+ tok/s without PLD, [0-9.]+ with' "$log")")
                # sampled, the draws on the GPU
                log="$w/1b_sampled_${v}_$r.log"
                env "$knob=$v" timeout 120 "$B/bench_pld" --backend cuda --model "$w/1b" \
                    --tokenizer "$w/tokenizer.json" --task random --n 2 --max-tokens 64 --reps 3 --temperature 0.8 \
                    --top-p 0.95 --rep-penalty 1.1 > "$log" 2>&1
                s+=("1b sampled $knob=$v round $r rc=$? $(grep -oE 'decode [0-9.]+ tok/s without PLD, [0-9.]+ with' "$log")")
            fi
        done
    done
    echo "==== summary"
    printf '%s\n' "${s[@]}" | tee "$w/summary.log"
    (cd "$w" && tar cJf "$out/engine_ab.tar.xz" ./*.log)
    ;;
*)
    echo "usage: bench/gpu_engine_ab.sh pack (here) | KNOB=NAME run [ROUNDS] (on the GPU box)" >&2
    exit 2
    ;;
esac
