#!/usr/bin/env bash
# Runs every test binary and shell suite, then prints the total as
# "N passed, N failed" (the line CI counts). Usage: run_all.sh BUILD [cuda]
set -u
build=${1:-build}
mode=${2:-cpu}
cd "$(dirname "$0")/.."
total_pass=0; total_fail=0; broken=()
run_one() {
    local name=$1; shift
    local log; log=$(mktemp)
    echo "== $name"
    "$@" >"$log" 2>&1
    local rc=$?
    cat "$log"
    local line; line=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$log" | tail -n 1)
    if [ -z "$line" ]; then
        echo "!! $name ended (rc=$rc) without a result line"
        total_fail=$((total_fail + 1)); broken+=("$name")
    else
        local p f; p=${line%% passed*}; f=${line#*, }; f=${f%% failed}
        total_pass=$((total_pass + p)); total_fail=$((total_fail + f))
        if [ "$f" != 0 ] || [ $rc -ne 0 ]; then broken+=("$name"); [ "$f" = 0 ] && total_fail=$((total_fail + 1)); fi
    fi
    rm -f "$log"
}
for t in "$build"/tests/test_*; do
    [ -x "$t" ] || continue
    case "$(basename "$t")" in
        test_cuda*) [ "$mode" = cuda ] || continue ;;
    esac
    run_one "$(basename "$t")" "$t"
done
for s in tests/suite_*.sh; do
    [ -f "$s" ] || continue
    [ "$mode" = cuda ] && continue
    run_one "$(basename "$s")" bash "$s" "$build"
done
[ ${#broken[@]} -gt 0 ] && echo "failing: ${broken[*]}"
echo "$total_pass passed, $total_fail failed"
[ "$total_fail" -eq 0 ]
