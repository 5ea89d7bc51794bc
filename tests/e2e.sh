#!/usr/bin/env bash
# End-to-end check of sanctum-mlx against a real server on a free loopback
# port, in ten phases: build, health, deep health (a real 2-token
# generation), models, non-stream, stream, errors, multi-turn, content
# arrays, shutdown. Ends with "N passed, N failed".
#
#   tests/e2e.sh [--skip-build] [--model DIR] [--build DIR] [-- extra server flags]
#
# Default model: models/default (CI). Needs curl and python3.
set -u
cd "$(dirname "$0")/.."

skip_build=0
model=${SANCTUM_E2E_MODEL:-models/default}
build=${BUILD:-build}
extra=()
while [ $# -gt 0 ]; do
    case "$1" in
    --skip-build) skip_build=1 ;;
    --model) model=$2; shift ;;
    --build) build=$2; shift ;;
    --) shift; extra=("$@"); break ;;
    *) echo "usage: $0 [--skip-build] [--model DIR] [--build DIR] [-- server flags]" >&2; exit 2 ;;
    esac
    shift
done

pass=0; fail=0
ok()  { pass=$((pass + 1)); echo "ok   $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1${2:+: $2}"; }
finish() {
    [ -n "${srv_pid:-}" ] && kill -0 "$srv_pid" 2>/dev/null && { kill -KILL "$srv_pid"; wait "$srv_pid" 2>/dev/null; }
    [ "$fail" -gt 0 ] && [ -f "${log:-/nonexistent}" ] && { echo "--- server log (tail)"; tail -n 30 "$log"; }
    [ -n "${tmp:-}" ] && rm -rf "$tmp"
    echo "$pass passed, $fail failed"
    [ "$fail" -eq 0 ]
    exit $?
}
trap finish EXIT

tmp=$(mktemp -d)
log=$tmp/server.log

# JSON assertions: py 'python expression over j' < json  -> exit 0 when true
py() { python3 -c "import json,sys
j=json.load(sys.stdin)
sys.exit(0 if ($1) else 1)" 2>/dev/null; }

# 1. build
if [ $skip_build -eq 1 ]; then
    [ -x "$build/sanctum-mlx" ] && ok "build (skipped, binary present)" || bad build "no $build/sanctum-mlx"
else
    if make -j2 "$build/sanctum-mlx" BUILD="$build" >"$tmp/build.log" 2>&1; then ok build
    else bad build "make failed (see below)"; tail -n 20 "$tmp/build.log"; exit 1; fi
fi
[ -x "$build/sanctum-mlx" ] || exit 1
if [ ! -d "$model" ]; then bad health "model directory $model does not exist"; exit 1; fi

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
base="http://127.0.0.1:$port"
"$build/sanctum-mlx" --model "$model" --port "$port" --shutdown-grace-seconds 30 "${extra[@]}" >"$log" 2>&1 &
srv_pid=$!

# 2. health: the server loads the model, then binds; wait for it.
up=0
for _ in $(seq 1 600); do
    kill -0 "$srv_pid" 2>/dev/null || break
    if curl -sf "$base/health" -o "$tmp/health.json" 2>/dev/null; then up=1; break; fi
    sleep 0.2
done
if [ $up -eq 1 ] && py 'j["status"]=="ok" and j["loaded"] is True' <"$tmp/health.json"; then ok health
else bad health "server did not come up"; exit 1; fi
model_id=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["model"])' <"$tmp/health.json")

post() { # post BODY OUTFILE -> prints the status code
    curl -s -o "$2" -w '%{http_code}' -H 'Content-Type: application/json' --data-binary "$1" "$base/v1/chat/completions"
}

# 3. deep health: a real 2-token generation through the whole stack.
code=$(post '{"messages":[{"role":"user","content":"Hi"}],"max_tokens":2,"temperature":0}' "$tmp/deep.json")
if [ "$code" = 200 ] && py 'j["usage"]["completion_tokens"]>=1 and j["usage"]["completion_tokens"]<=2 and j["choices"][0]["finish_reason"] in ("stop","length")' <"$tmp/deep.json"
then ok "deep health"; else bad "deep health" "status $code $(head -c 300 "$tmp/deep.json")"; fi

# 4. models
code=$(curl -s -o "$tmp/models.json" -w '%{http_code}' "$base/v1/models")
if [ "$code" = 200 ] && MID="$model_id" py 'j["object"]=="list" and j["data"][0]["id"]==__import__("os").environ["MID"] and j["data"][0]["object"]=="model"' <"$tmp/models.json"
then ok models; else bad models "status $code $(head -c 300 "$tmp/models.json")"; fi

# 5. non-stream: full response shape.
code=$(post "{\"model\":\"$model_id\",\"messages\":[{\"role\":\"system\",\"content\":\"You are terse.\"},{\"role\":\"user\",\"content\":\"Count to five.\"}],\"max_tokens\":16,\"temperature\":0}" "$tmp/ns.json")
if [ "$code" = 200 ] && py '(j["object"]=="chat.completion" and j["id"].startswith("chatcmpl-") and isinstance(j["created"],int)
    and j["choices"][0]["message"]["role"]=="assistant" and isinstance(j["choices"][0]["message"]["content"],str)
    and j["choices"][0]["finish_reason"] in ("stop","length") and j["system_fingerprint"]
    and j["usage"]["total_tokens"]==j["usage"]["prompt_tokens"]+j["usage"]["completion_tokens"]
    and j["usage"]["prompt_tokens"]>0 and 1<=j["usage"]["completion_tokens"]<=16)' <"$tmp/ns.json"
then ok non-stream; else bad non-stream "status $code $(head -c 400 "$tmp/ns.json")"; fi

# 6. stream: SSE framing as curl receives it, and the same text as non-stream.
curl -sN -H 'Content-Type: application/json' -D "$tmp/st.hdr" \
    --data-binary "{\"messages\":[{\"role\":\"system\",\"content\":\"You are terse.\"},{\"role\":\"user\",\"content\":\"Count to five.\"}],\"max_tokens\":16,\"temperature\":0,\"stream\":true,\"stream_options\":{\"include_usage\":true}}" \
    "$base/v1/chat/completions" >"$tmp/st.sse"
if python3 - "$tmp/st.sse" "$tmp/ns.json" "$tmp/st.hdr" <<'EOF'
import json, sys
raw = open(sys.argv[1], encoding="utf-8").read()
ns = json.load(open(sys.argv[2]))
hdr = open(sys.argv[3]).read().lower()
assert "content-type: text/event-stream" in hdr, hdr
events = raw.split("\n\n")
assert events[-1] == "", "stream must end with a blank line"
events = events[:-1]
assert all(e.startswith("data: ") and "\n" not in e for e in events), "every event is one data: line"
assert events[-1] == "data: [DONE]", events[-1]
chunks = [json.loads(e[6:]) for e in events[:-1]]
assert chunks[0]["choices"][0]["delta"].get("role") == "assistant"
text, finish, usage = "", None, None
for c in chunks:
    assert c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"]
    if c["choices"]:
        ch = c["choices"][0]
        text += ch["delta"].get("content") or ""
        if ch["finish_reason"]:
            assert finish is None
            finish = ch["finish_reason"]
    else:
        usage = c["usage"]
assert finish in ("stop", "length"), finish
assert usage and usage["completion_tokens"] == ns["usage"]["completion_tokens"], (usage, ns["usage"])
assert text == ns["choices"][0]["message"]["content"], (text, ns["choices"][0]["message"]["content"])
EOF
then ok stream; else bad stream "$(head -c 400 "$tmp/st.sse")"; fi

# 7. errors: OpenAI-style bodies with the right status.
err_ok=1
check_err() { # name expected_status body [path] [method]
    local code
    if [ -n "${5:-}" ]; then code=$(curl -s -o "$tmp/err.json" -w '%{http_code}' -X "$5" "$base${4:-/v1/chat/completions}")
    else code=$(curl -s -o "$tmp/err.json" -w '%{http_code}' -H 'Content-Type: application/json' --data-binary "$3" "$base${4:-/v1/chat/completions}"); fi
    # Plain greps (no python per case): the body is compact JSON in a fixed key order.
    if [ "$code" != "$2" ] || ! grep -q '^{"error":{"message":"[^"]' "$tmp/err.json" \
       || ! grep -q '"type":"[a-z_]*","param":\(null\|"[^"]*"\),"code":' "$tmp/err.json"; then
        err_ok=0; echo "     $1: expected $2, got $code $(head -c 200 "$tmp/err.json")"
    fi
}
check_err "bad json" 400 '{"messages": ['
check_err "empty messages" 400 '{"messages": []}'
check_err "wrong type" 400 '{"messages": [{"role":"user","content":"x"}], "max_tokens": "ten"}'
check_err "negative max_tokens" 400 '{"messages": [{"role":"user","content":"x"}], "max_tokens": -5}'
check_err "absurd max_tokens" 400 '{"messages": [{"role":"user","content":"x"}], "max_tokens": 99999999999}'
check_err "image part" 400 '{"messages": [{"role":"user","content":[{"type":"image_url","image_url":{"url":"http://x/y.png"}}]}]}'
check_err "n=2" 400 '{"messages": [{"role":"user","content":"x"}], "n": 2}'
check_err "unknown model" 404 '{"model":"no-such-model","messages": [{"role":"user","content":"x"}]}'
check_err "unknown route" 404 '' /v1/nothing GET
check_err "wrong method" 405 '' /v1/chat/completions GET
check_err "wrong method models" 405 '' /v1/models DELETE
printf '{"messages":[{"role":"user","content":"\xff\xfe"}]}' >"$tmp/badutf8.json"
code=$(curl -s -o "$tmp/err.json" -w '%{http_code}' -H 'Content-Type: application/json' --data-binary @"$tmp/badutf8.json" "$base/v1/chat/completions")
[ "$code" = 400 ] && grep -q 'UTF-8' "$tmp/err.json" || { err_ok=0; echo "     invalid utf-8: got $code"; }
[ $err_ok -eq 1 ] && ok errors || bad errors

# 8. multi-turn: assistant history is accepted and the prompt grows.
code=$(post '{"messages":[{"role":"user","content":"My name is Ada."},{"role":"assistant","content":"Hello Ada."},{"role":"user","content":"What is my name?"}],"max_tokens":4,"temperature":0}' "$tmp/mt.json")
code1=$(post '{"messages":[{"role":"user","content":"What is my name?"}],"max_tokens":4,"temperature":0}' "$tmp/mt1.json")
if [ "$code" = 200 ] && [ "$code1" = 200 ] && python3 - "$tmp/mt.json" "$tmp/mt1.json" <<'EOF'
import json, sys
a, b = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
assert a["usage"]["prompt_tokens"] > b["usage"]["prompt_tokens"] + 4
EOF
then ok multi-turn; else bad multi-turn "status $code/$code1 $(head -c 300 "$tmp/mt.json")"; fi

# 9. content arrays: text parts give the same completion as the joined string.
code=$(post '{"messages":[{"role":"user","content":[{"type":"text","text":"Count "},{"type":"text","text":"to five."}]}],"max_tokens":8,"temperature":0}' "$tmp/ca.json")
code1=$(post '{"messages":[{"role":"user","content":"Count to five."}],"max_tokens":8,"temperature":0}' "$tmp/ca1.json")
if [ "$code" = 200 ] && [ "$code1" = 200 ] && python3 - "$tmp/ca.json" "$tmp/ca1.json" <<'EOF'
import json, sys
a, b = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
assert a["choices"][0]["message"]["content"] == b["choices"][0]["message"]["content"]
keys = ("prompt_tokens", "completion_tokens", "total_tokens")   # prompt_tokens_details differ on a cache hit
assert [a["usage"][k] for k in keys] == [b["usage"][k] for k in keys]
EOF
then ok "content arrays"; else bad "content arrays" "status $code/$code1"; fi

# 10. shutdown: SIGTERM while a generation streams; it completes, exit 0.
curl -sN -H 'Content-Type: application/json' \
    --data-binary '{"messages":[{"role":"user","content":"Tell me a long story."}],"max_tokens":64,"temperature":0,"stream":true}' \
    "$base/v1/chat/completions" >"$tmp/sd.sse" &
cpid=$!
for _ in $(seq 1 100); do [ -s "$tmp/sd.sse" ] && break; sleep 0.05; done
kill -TERM "$srv_pid"
wait $cpid
rc_wait=0
for _ in $(seq 1 600); do kill -0 "$srv_pid" 2>/dev/null || break; sleep 0.1; done
wait "$srv_pid"; rc_wait=$?
srv_pid=
if [ $rc_wait -eq 0 ] && tail -c 20 "$tmp/sd.sse" | grep -q 'data: \[DONE\]' && grep -q '"finish_reason":"\(stop\|length\)"' "$tmp/sd.sse"
then ok shutdown; else bad shutdown "exit $rc_wait, stream tail: $(tail -c 200 "$tmp/sd.sse")"; fi
