#!/usr/bin/env bash
# Parity smoke on the shipped default model: the 10 prompts of
# tests/parity-smoke.json at temperature 0 must reproduce transformers'
# greedy tokens exactly and contain their known-good substrings.
# Usage: suite_parity.sh BUILD [cpu|cuda]   Ends with "N passed, N failed".
set -u
build=${1:-build}
backend=${2:-cpu}
cd "$(dirname "$0")/.."
if [ ! -x "$build/sanctum-run" ]; then
    echo "  SKIP: $build/sanctum-run is not built"
    echo "0 passed, 0 failed"
    exit 0
fi
log=$(mktemp); trap 'rm -f "$log"' EXIT
python3 tools/python/check_parity.py --bin "$build/sanctum-run" --model models/default \
    --battery tests/parity-smoke.json --backend "$backend" | tee "$log"
line=$(tail -n 1 "$log")
pass=${line%% passed*}; fail=${line#*, }; fail=${fail%% failed}
case "$pass$fail" in *[!0-9]*|"") pass=0; fail=1 ;; esac

# The canary question through the real server: the answer must be exactly "4".
out=$(mktemp -d)
"$build/sanctum-mlx" --model models/default --port 0 --backend "$backend" >"$out/log" 2>&1 &
pid=$!
port=""
for _ in $(seq 1 100); do
    port=$(grep -oE 'listening on (http://)?127\.0\.0\.1:[0-9]+' "$out/log" | head -n 1 | grep -oE '[0-9]+$')
    [ -n "$port" ] && break
    sleep 0.1
done
answer=""
if [ -n "$port" ]; then
    answer=$(curl -s --max-time 60 "http://127.0.0.1:$port/v1/chat/completions" -H 'content-type: application/json' \
        -d '{"messages":[{"role":"user","content":"What is 2+2? Respond with only the number."}],"temperature":0,"max_tokens":8}' |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["message"]["content"])' 2>/dev/null)
fi
kill -TERM $pid 2>/dev/null; wait $pid 2>/dev/null
if [ "$answer" = "4" ]; then
    echo "ok   server answers \"What is 2+2?\" with 4"; pass=$((pass + 1))
else
    echo "FAIL server answer to \"What is 2+2?\": '$answer' (port '$port')"; sed 's/^/  server: /' "$out/log" | tail -n 5
    fail=$((fail + 1))
fi
rm -rf "$out"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
