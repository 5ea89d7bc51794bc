#!/usr/bin/env bash
# Loopback load benchmark of sanctum-mlx: N concurrent streaming clients for
# D seconds against a fresh server. Reports requests/s, completion tokens/s,
# time to first token p50/p99, /health latency p50/p99/max under that load,
# and the server's RSS before and after (it must not grow run over run).
# The bound: one worker serves one request at a time, so the aggregate
# decode rate can at most match a single stream's (measured first, alone).
# Appends one line to bench/results.log with the command that reproduces it.
#
#   bench/load.sh [--model DIR | --synthetic] [--build DIR] [--clients 16] [--duration 60]
#                 [--max-tokens 64] [-- extra server flags]
#
# --synthetic: the small random-weight qwen3_5 of tests/suite_server.sh
# (measures the server, not the model).
set -u
cd "$(dirname "$0")/.."
model=models/default; build=build; clients=16; duration=60; max_tokens=64; extra=(); synthetic=0
cmdline="bench/load.sh $*"
while [ $# -gt 0 ]; do
    case "$1" in
    --model) model=$2; shift ;;
    --synthetic) synthetic=1 ;;
    --build) build=$2; shift ;;
    --clients) clients=$2; shift ;;
    --duration) duration=$2; shift ;;
    --max-tokens) max_tokens=$2; shift ;;
    --) shift; extra=("$@"); break ;;
    *) echo "usage: $0 [--model DIR | --synthetic] [--build DIR] [--clients N] [--duration S] [--max-tokens N] [-- server flags]" >&2; exit 2 ;;
    esac
    shift
done
[ -x "$build/sanctum-mlx" ] || { echo "load.sh: $build/sanctum-mlx missing (make first)" >&2; exit 1; }
if [ $synthetic -eq 1 ]; then
    model=$(mktemp -d)/synthetic-qwen3_5
    bash tests/suite_server.sh "$build" --make-model "$model" >/dev/null || { echo "load.sh: cannot write the synthetic model" >&2; exit 1; }
fi
[ -d "$model" ] || { echo "load.sh: model directory $model missing" >&2; exit 1; }
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
log=$(mktemp)
"$build/sanctum-mlx" --model "$model" --port "$port" --max-queue $((clients + 4)) "${extra[@]}" >"$log" 2>&1 &
pid=$!
trap 'kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; rm -f "$log"; [ $synthetic -eq 1 ] && rm -rf "$(dirname "$model")"' EXIT
for _ in $(seq 1 600); do curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break; sleep 0.1; done
curl -sf "http://127.0.0.1:$port/health" >/dev/null || { echo "load.sh: server did not start"; cat "$log"; exit 1; }

result=$(PORT=$port PID=$pid CLIENTS=$clients DURATION=$duration MAXTOK=$max_tokens python3 - <<'EOF'
import http.client, json, os, socket, statistics, threading, time

port, pid = int(os.environ["PORT"]), int(os.environ["PID"])
clients, duration, maxtok = int(os.environ["CLIENTS"]), float(os.environ["DURATION"]), int(os.environ["MAXTOK"])

def rss_mb():
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    return float("nan")

def one_stream(prompt):
    """Returns (ttft_s, total_s, completion_tokens) of one streamed request."""
    body = json.dumps({"messages": [{"role": "user", "content": prompt}], "max_tokens": maxtok,
                       "temperature": 0, "stream": True, "stream_options": {"include_usage": True}})
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.perf_counter()
    c.request("POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        r.read(); c.close()
        return None
    ttft, toks = None, 0
    while True:
        line = r.readline()
        if not line:
            break
        if not line.startswith(b"data: "):
            continue
        data = line[6:].strip()
        if data == b"[DONE]":
            break
        ch = json.loads(data)
        if ch.get("choices") and ch["choices"][0]["delta"].get("content") and ttft is None:
            ttft = time.perf_counter() - t0
        if ch.get("usage"):
            toks = ch["usage"]["completion_tokens"]
    total = time.perf_counter() - t0
    c.close()
    return (ttft if ttft is not None else total, total, toks)

# The bound: one request alone, decode rate (tokens after the first over
# the time after the first token).
one_stream("Warm up.")
solo = [one_stream(f"Solo run {i}.") for i in range(3)]
solo_tps = sum(max(s[2] - 1, 0) for s in solo) / max(sum(s[1] - s[0] for s in solo), 1e-9)

def run_load(seconds):
    stop = threading.Event()
    lock = threading.Lock()
    res = {"ttfts": [], "tokens": 0, "done": 0, "fail": 0, "health": []}
    def client(i):
        k = 0
        while not stop.is_set():
            r = one_stream(f"Client {i} request {k}: tell me something.")
            k += 1
            with lock:
                if r is None:
                    res["fail"] += 1
                elif not stop.is_set():
                    res["ttfts"].append(r[0]); res["tokens"] += r[2]; res["done"] += 1
    def prober():
        while not stop.is_set():
            t1 = time.perf_counter()
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            c.request("GET", "/health"); c.getresponse().read(); c.close()
            res["health"].append(time.perf_counter() - t1)
            time.sleep(0.1)
    ts = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    ts.append(threading.Thread(target=prober, daemon=True))
    t0 = time.time()
    for t in ts: t.start()
    time.sleep(seconds)
    stop.set()
    res["elapsed"] = time.time() - t0
    for t in ts: t.join(timeout=600)
    time.sleep(0.5)
    return res

# A short warm pass first so the "before" RSS already holds what a loaded
# server needs (KV pages touched, allocator arenas); the long pass must not
# add to it.
run_load(min(5.0, duration / 6))
rss_before = rss_mb()
L = run_load(duration)
rss_after = rss_mb()
elapsed, ttfts, health = L["elapsed"], L["ttfts"], L["health"]
n_done, n_fail, done_tokens = [L["done"]], [L["fail"]], [L["tokens"]]

def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(len(v) * p))] if v else float("nan")
out = {
    "clients": clients, "duration_s": round(elapsed, 1), "requests": n_done[0], "failed": n_fail[0],
    "req_per_s": round(n_done[0] / elapsed, 3), "tok_per_s": round(done_tokens[0] / elapsed, 1),
    "solo_tok_per_s": round(solo_tps, 1),
    "ttft_p50_ms": round(pct(ttfts, 0.5) * 1e3, 1), "ttft_p99_ms": round(pct(ttfts, 0.99) * 1e3, 1),
    "health_p50_ms": round(pct(health, 0.5) * 1e3, 2), "health_p99_ms": round(pct(health, 0.99) * 1e3, 2),
    "health_max_ms": round(max(health) * 1e3, 2) if health else None,
    "rss_before_mb": round(rss_before, 1), "rss_after_mb": round(rss_after, 1),
}
r = out
print(f"{r['clients']} streaming clients x {r['duration_s']}s: {r['requests']} requests ({r['failed']} failed), "
      f"{r['req_per_s']} req/s, {r['tok_per_s']} tok/s (bound: one worker, solo decode {r['solo_tok_per_s']} tok/s), "
      f"TTFT p50 {r['ttft_p50_ms']} ms p99 {r['ttft_p99_ms']} ms, /health p50 {r['health_p50_ms']} ms "
      f"p99 {r['health_p99_ms']} ms max {r['health_max_ms']} ms, RSS after warm-up {r['rss_before_mb']} MB -> after run {r['rss_after_mb']} MB")
EOF
)
[ -n "$result" ] || { echo "load.sh: the load run failed"; tail -n 20 "$log"; exit 1; }
model_id=$(curl -s "http://127.0.0.1:$port/v1/models" | python3 -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["id"])')
summary=$result
echo "$summary"
line="$(date -u +%Y-%m-%dT%H:%M:%SZ) load model=$model_id rev=$(git rev-parse --short HEAD 2>/dev/null || echo ?) cpu=\"$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')\" nproc=$(nproc) | $summary | cmd: $cmdline"
echo "$line" >> bench/results.log
