#!/usr/bin/env bash
# Security suite against the real sanctum-mlx binary: signed manifest gate,
# mTLS listener, bearer tokens. Usage: tests/suite_tls.sh BUILD_DIR
#
# Model: $SANCTUM_TEST_MODEL, else models/default (when it has config.json),
# else a tiny random qwen3_5 made with BUILD/sanctum-synth and the vendored
# Qwen3 tokenizer. SKIPs visibly (0 passed, 0 failed) while the server binary
# or a model is missing. Ends with "N passed, N failed".
set -u
build=${1:-build}
cd "$(dirname "$0")/.."
root=$(pwd)
pass=0; fail=0
ok()   { echo "ok $1"; pass=$((pass + 1)); }
bad()  { echo "not ok $1: $2"; fail=$((fail + 1)); }
check() { local name=$1; shift; if "$@"; then ok "$name"; else bad "$name" "${why:-condition false}"; fi; why=; }
finish() { echo "$pass passed, $fail failed"; [ "$fail" -eq 0 ]; exit; }

server=$build/sanctum-mlx
signer=$build/sign_manifest
if [ ! -x "$server" ]; then echo "  SKIP: $server not built"; finish; fi
if [ ! -x "$signer" ]; then echo "  SKIP: $signer not built"; finish; fi
for t in curl openssl ss; do
    command -v $t >/dev/null || { echo "  SKIP: $t not installed"; finish; }
done

tmp=$(mktemp -d /tmp/sn_suite_tls_XXXXXX)
pids=()
cleanup() {
    for p in ${pids[@]+"${pids[@]}"}; do kill "$p" 2>/dev/null; done
    for p in ${pids[@]+"${pids[@]}"}; do wait "$p" 2>/dev/null; done
    rm -rf "$tmp"
}
trap cleanup EXIT

# ---------------------------------------------------------------- model
synthetic=0
model=${SANCTUM_TEST_MODEL:-}
if [ -z "$model" ] && [ -f models/default/config.json ]; then model=models/default; fi
if [ -z "$model" ] && [ -x "$build/sanctum-synth" ] && [ -f tests/fixtures/tokenizer/qwen3/tokenizer.json.gz ]; then
    cat > "$tmp/tiny.json" <<'EOF'
{ "architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5", "tie_word_embeddings": true,
  "eos_token_id": 248046,
  "text_config": { "model_type": "qwen3_5_text", "hidden_size": 64, "num_hidden_layers": 2,
    "intermediate_size": 128, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32,
    "linear_num_key_heads": 2, "linear_num_value_heads": 2, "linear_key_head_dim": 32,
    "linear_value_head_dim": 32, "linear_conv_kernel_dim": 4, "full_attention_interval": 2,
    "rms_norm_eps": 1e-06, "vocab_size": 248320, "max_position_embeddings": 4096, "hidden_act": "silu",
    "attention_bias": false, "tie_word_embeddings": true,
    "rope_parameters": { "rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25,
      "mrope_section": [11, 11, 10], "mrope_interleaved": true }, "eos_token_id": 248046 } }
EOF
    if "$build/sanctum-synth" --config "$tmp/tiny.json" --out "$tmp/model" >"$tmp/synth.log" 2>&1; then
        gzip -dc tests/fixtures/tokenizer/qwen3/tokenizer.json.gz > "$tmp/model/tokenizer.json"
        model=$tmp/model; synthetic=1
    else
        echo "  (sanctum-synth failed: $(tail -n 1 "$tmp/synth.log"))"
    fi
fi
if [ -z "$model" ]; then echo "  SKIP: no model (set SANCTUM_TEST_MODEL or add models/default)"; finish; fi
model=$(cd "$model" && pwd)
echo "  model: $model"

# ------------------------------------------------------------- helpers
# Ports below the kernel's ephemeral range (32768+), so an outgoing
# connection cannot be holding one, and never the same port twice in a run,
# so a server still shutting down cannot collide with the next one (the
# list lives in a file: free_port runs in $(...) subshells).
free_port() {
    local p
    while :; do
        p=$((10000 + RANDOM % 22000))
        grep -qx "$p" "$tmp/used_ports" 2>/dev/null && continue
        if [ -z "$(ss -tanH "sport = :$p" 2>/dev/null)" ]; then
            echo "$p" >>"$tmp/used_ports"
            echo $p
            return
        fi
    done
}
listening() { [ -n "$(ss -ltnH "sport = :$1" 2>/dev/null)" ]; }

# start NAME URL CURL_ARGS... -- SERVER_ARGS...: runs the server in the
# background (log in $tmp/NAME.log) and waits until URL answers /health.
# URL and SERVER_ARGS name its ports as @P@ and @Q@: each try takes fresh
# ones, left in $P and $Q. free_port's check and the server's bind are
# seconds apart (the model loads between them), so another process on the
# machine can take a port in between; a server that exits with "Address
# already in use" is started again on new ports (3 tries), since that is
# the machine's doing, not the server's.
start() {
    local name=$1 url0=$2; shift 2
    local cargs=()
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do cargs+=("$1"); shift; done
    shift
    local sargs0=("$@") try
    for try in 1 2 3; do
        P=$(free_port); Q=$(free_port)
        local url=${url0//@P@/$P} a sargs=()
        url=${url//@Q@/$Q}
        for a in "${sargs0[@]}"; do a=${a//@P@/$P}; sargs+=("${a//@Q@/$Q}"); done
        "$server" --model "$model" "${sargs[@]}" >"$tmp/$name.log" 2>&1 &
        local pid=$! died=0
        pids+=("$pid")
        eval "pid_$name=$pid"
        for _ in $(seq 1 600); do
            if ! kill -0 "$pid" 2>/dev/null; then died=1; break; fi
            if [ "$(curl -s -m 2 -o /dev/null -w '%{http_code}' ${cargs[@]+"${cargs[@]}"} "$url/health")" = 200 ]; then
                return 0
            fi
            sleep 0.2
        done
        if [ $died = 1 ] && grep -q "Address already in use" "$tmp/$name.log"; then
            echo "  (start $name: a port was taken before the server bound it; again on new ports)"
            continue
        fi
        return 1
    done
    return 1
}
stop() {
    local pid; eval "pid=\${pid_$1:-}"
    [ -n "$pid" ] || return 0
    kill -TERM "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
}
# refuse NAME PATTERN SERVER_ARGS...: the server must exit non-zero with
# PATTERN in its output and never bind the port given with --port.
refuse() {
    local name=$1 pat=$2; shift 2
    timeout 120 "$server" --model "$model" "$@" >"$tmp/$name.log" 2>&1
    local rc=$?
    if [ $rc -eq 0 ] || [ $rc -eq 124 ]; then why="exit $rc (expected a refusal)"; return 1; fi
    if ! grep -q -- "$pat" "$tmp/$name.log"; then why="no '$pat' in: $(tail -n 3 "$tmp/$name.log")"; return 1; fi
    return 0
}
code() { curl -s -m 10 -o "$tmp/body" -w '%{http_code}' "$@"; }

# ------------------------------------------------------------ baseline
if ! start base "http://127.0.0.1:@P@" -- --port @P@; then
    if [ "$synthetic" = 1 ]; then
        echo "  SKIP: the server does not start with the synthetic model: $(tail -n 2 "$tmp/base.log" | tr '\n' ' ')"
        finish
    fi
    bad baseline_start "server did not start: $(tail -n 3 "$tmp/base.log" | tr '\n' ' ')"
    finish
fi
ok baseline_start
stop base

# ------------------------------------------------------------- manifest
key=$tmp/signing.key
"$signer" keygen --out "$key" 2>/dev/null
check keygen_key_mode_0600 [ "$(stat -c %a "$key")" = 600 ] 
check keygen_pub_32_bytes [ "$(stat -c %s "$key.pub")" = 32 ]
"$signer" create --model "$model" > "$tmp/manifest" 2>"$tmp/create.err"
check create_lists_config grep -q "  config.json$" "$tmp/manifest"
"$signer" sign --key "$key" "$tmp/manifest" 2>/dev/null
check sign_writes_64_bytes [ "$(stat -c %s "$tmp/manifest.sig" 2>/dev/null)" = 64 ]
check verify_ok "$signer" verify --pubkey "$key.pub" "$tmp/manifest" --model "$model"
sig_ok() { "$signer" verify --pubkey "$key.pub" "$1" --sig "$2" >/dev/null 2>"$tmp/verify.err"; }

if start signed "http://127.0.0.1:@P@" -- --port @P@ --manifest "$tmp/manifest" --manifest-pubkey "$key.pub" \
        --require-signed-manifest; then
    P1=$P
    ok server_starts_with_signed_manifest
    curl -s -m 10 "http://127.0.0.1:$P1/metrics" > "$tmp/metrics"
    check startup_metric_manifest_verify grep -q 'sanctum_mlx_startup_seconds{phase="manifest_verify"}' "$tmp/metrics"
else
    bad server_starts_with_signed_manifest "$(tail -n 3 "$tmp/signed.log" | tr '\n' ' ')"
fi
stop signed

# flipped byte in the manifest (first hash digit) with the old signature
cp "$tmp/manifest" "$tmp/m_flip"; cp "$tmp/manifest.sig" "$tmp/m_flip.sig"
c=$(head -c 1 "$tmp/m_flip"); [ "$c" = 0 ] && n=1 || n=0
printf '%s' "$n" | dd of="$tmp/m_flip" bs=1 seek=0 conv=notrunc status=none
check cli_verify_rejects_flipped_manifest bash -c "! $(printf %q "$signer") verify --pubkey $(printf %q "$key.pub") $(printf %q "$tmp/m_flip") 2>$(printf %q "$tmp/v.err")"
check cli_message_has_openssl_text grep -q "OpenSSL" "$tmp/v.err"
P2=$(free_port)
check server_refuses_flipped_manifest refuse m_flip "m_flip" --port "$P2" --manifest "$tmp/m_flip" \
    --manifest-pubkey "$key.pub"
check refused_server_bound_nothing bash -c "! [ -n \"\$(ss -ltnH 'sport = :$P2')\" ]"

# flipped byte in the signature
cp "$tmp/manifest" "$tmp/s_flip"; cp "$tmp/manifest.sig" "$tmp/s_flip.sig"
b=$(od -An -tu1 -j 20 -N 1 "$tmp/s_flip.sig" | tr -d ' ')
printf "\\$(printf %03o $(( (b ^ 1) & 255 )))" | dd of="$tmp/s_flip.sig" bs=1 seek=20 conv=notrunc status=none
check server_refuses_flipped_signature refuse s_flip "s_flip.sig" --port "$(free_port)" \
    --manifest "$tmp/s_flip" --manifest-pubkey "$key.pub"

# a weight that differs from the manifest: same manifest with one hash changed, properly signed
first=$(grep -m1 '\.safetensors$' "$tmp/manifest" | sed 's/^[0-9a-f]*  //')
awk -v f="$first" '{ if (substr($0, 67) == f) { c = substr($0, 1, 1); $0 = (c == "0" ? "1" : "0") substr($0, 2) } print }' \
    "$tmp/manifest" > "$tmp/w_flip"
"$signer" sign --key "$key" "$tmp/w_flip" 2>/dev/null
check server_refuses_weight_mismatch refuse w_flip "$first: SHA-256 mismatch" --port "$(free_port)" \
    --manifest "$tmp/w_flip" --manifest-pubkey "$key.pub"
# a real flipped byte in a weight file, in a scratch copy of the model when it is small
msize=$(du -sbL "$model" | cut -f1)
if [ "$msize" -lt $((512 * 1024 * 1024)) ]; then
    cp -rL "$model" "$tmp/flipmodel"
    wf=$tmp/flipmodel/$first
    sz=$(stat -c %s "$wf"); off=$((sz / 2))
    b=$(od -An -tu1 -j $off -N 1 "$wf" | tr -d ' ')
    printf "\\$(printf %03o $(( (b ^ 1) & 255 )))" | dd of="$wf" bs=1 seek=$off conv=notrunc status=none
    check server_refuses_flipped_weight_byte bash -c "timeout 120 '$server' --model '$tmp/flipmodel' --port $(free_port) \
        --manifest '$tmp/manifest' --manifest-pubkey '$key.pub' >'$tmp/wb.log' 2>&1;
        [ \$? -ne 0 ] && grep -q -- '$first: SHA-256 mismatch' '$tmp/wb.log'"
    rm -rf "$tmp/flipmodel"
else
    echo "  SKIP flipped weight byte: model is $msize bytes, too big to copy (the hash-mismatch case above covers the gate)"
fi

# a weight file that is not listed
grep -v '  config.json$' "$tmp/manifest" > "$tmp/unlisted"
"$signer" sign --key "$key" "$tmp/unlisted" 2>/dev/null
check server_refuses_unlisted_weight refuse unlisted "config.json: weight file is not listed" \
    --port "$(free_port)" --manifest "$tmp/unlisted" --manifest-pubkey "$key.pub"
# a listed file that is missing
{ cat "$tmp/manifest"; echo "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855  gone.safetensors"; } > "$tmp/missing"
"$signer" sign --key "$key" "$tmp/missing" 2>/dev/null
check server_refuses_missing_file refuse missing "gone.safetensors" --port "$(free_port)" \
    --manifest "$tmp/missing" --manifest-pubkey "$key.pub"
# unsigned + --require-signed-manifest; missing signature file
check server_refuses_unsigned_when_required refuse unsigned "unsigned" --port "$(free_port)" \
    --manifest "$tmp/manifest" --require-signed-manifest
cp "$tmp/manifest" "$tmp/nosig"
check server_refuses_missing_signature refuse nosig "nosig.sig" --port "$(free_port)" \
    --manifest "$tmp/nosig" --manifest-pubkey "$key.pub"

# A weight file swapped between the gate and the load: strace holds each
# thread's first open of config.json for 3 s (its counters are per thread:
# a hash worker's open in the gate, then the main thread's in the loader);
# while the loader waits, an identical copy of the first weight file is
# renamed over it. The bytes still match the manifest, but it is not the file the
# gate hashed: the loader must refuse it (pins), before mapping it.
if command -v strace >/dev/null && [ "$msize" -lt $((512 * 1024 * 1024)) ] &&
   strace -f -qq -o /dev/null -e trace=none true 2>/dev/null; then
    sm=$tmp/swapmodel
    cp -rL "$model" "$sm"
    "$signer" create --model "$sm" > "$tmp/swap.manifest" 2>/dev/null
    "$signer" sign --key "$key" "$tmp/swap.manifest" 2>/dev/null
    SP=$(free_port)
    timeout 120 strace -f -qq -o /dev/null -P "$sm/config.json" -e trace=openat \
        -e inject=openat:delay_enter=3000000:when=1 "$server" --model "$sm" --port "$SP" \
        --manifest "$tmp/swap.manifest" --manifest-pubkey "$key.pub" >"$tmp/swap.log" 2>&1 &
    swap_pid=$!
    for _ in $(seq 1 300); do grep -q "manifest ok" "$tmp/swap.log" && break; sleep 0.1; done
    cp "$sm/$first" "$tmp/swapcopy" && mv "$tmp/swapcopy" "$sm/$first"
    wait "$swap_pid"; swap_rc=$?
    why="exit $swap_rc: $(tail -n 2 "$tmp/swap.log" | tr '\n' ' ')"
    check server_refuses_weight_swapped_after_gate bash -c "[ $swap_rc -ne 0 ] && [ $swap_rc -ne 124 ] &&
        grep -q 'manifest ok' '$tmp/swap.log' &&
        grep -q -- 'model file $first changed after the manifest was verified' '$tmp/swap.log'"
    check swapped_server_bound_nothing bash -c "! [ -n \"\$(ss -ltnH 'sport = :$SP')\" ]"
    rm -rf "$sm"
else
    echo "  SKIP weight swapped after the gate: needs strace (ptrace allowed) and a model under 512 MB"
fi

# ----------------------------------------------------------------- mTLS
certs=$tmp/certs
deploy/mtls-gen-certs.sh --out "$certs" --host 127.0.0.1 --host localhost --client alice --client bob \
    --expired-client old --revoke bob >/dev/null 2>"$tmp/certs.err" &&
deploy/mtls-gen-certs.sh --out "$tmp/other" --host 127.0.0.1 --client mallory >/dev/null 2>>"$tmp/certs.err"
check certs_made test -s "$certs/clients/alice.crt" -a -s "$tmp/other/clients/mallory.crt" -a -s "$certs/crl.pem"
check cert_keys_0600 [ "$(stat -c %a "$certs/server.key")" = 600 ] 
tls() { local who=$1 dir=${2:-$certs}
        echo --cacert "$certs/ca.crt" --cert "$dir/clients/$who.crt" --key "$dir/clients/$who.key"; }
if start mtls "https://127.0.0.1:@P@" $(tls alice) -- --no-plain --port @Q@ --tls-port @P@ \
        --tls-host 127.0.0.1 --tls-cert "$certs/server.crt" --tls-key "$certs/server.key" \
        --tls-ca "$certs/ca.crt" --tls-crl "$certs/crl.pem"; then
    TP=$P; PP=$Q
    ok mtls_server_starts
    check valid_client_200 [ "$(code $(tls alice) "https://127.0.0.1:$TP/v1/models")" = 200 ]
    sleep 0.3
    check cn_in_request_log grep -q "req route=.* cn=alice" "$tmp/mtls.log"
    check cn_in_audit_line grep -q "audit tls accept cn=alice" "$tmp/mtls.log"
    check no_client_cert_fails [ "$(code --cacert "$certs/ca.crt" "https://127.0.0.1:$TP/v1/models")" = 000 ]
    check other_ca_fails [ "$(code $(tls mallory "$tmp/other") "https://127.0.0.1:$TP/v1/models")" = 000 ]
    check revoked_fails [ "$(code $(tls bob) "https://127.0.0.1:$TP/v1/models")" = 000 ]
    check expired_fails [ "$(code $(tls old) "https://127.0.0.1:$TP/v1/models")" = 000 ]
    sleep 0.3
    check reject_reasons_logged bash -c "grep -q 'reason=certificate revoked' '$tmp/mtls.log' &&
        grep -q 'reason=certificate has expired' '$tmp/mtls.log' && grep -q 'reason=no client certificate' '$tmp/mtls.log'"
    # 4 refused handshakes above (no cert, other CA, revoked, expired), accepted ones for alice
    check tls_handshake_metrics bash -c "m=\$(curl -s -m 5 $(tls alice) https://127.0.0.1:$TP/metrics) &&
        echo \"\$m\" | grep -qE '^sanctum_mlx_tls_handshakes_total\\{result=\"rejected\"\\} ([4-9]|[1-9][0-9]+)$' &&
        echo \"\$m\" | grep -qE '^sanctum_mlx_tls_handshakes_total\\{result=\"accepted\"\\} [1-9]'"
    check no_plain_nothing_on_plain_port bash -c "! [ -n \"\$(ss -ltnH 'sport = :$PP')\" ] &&
        [ \"\$(curl -s -m 5 -o /dev/null -w '%{http_code}' http://127.0.0.1:$PP/health)\" = 000 ]"
    # revocation without a restart: revoke alice, SIGHUP, refused
    deploy/mtls-gen-certs.sh --out "$certs" --revoke alice >/dev/null 2>>"$tmp/certs.err"
    kill -HUP "$pid_mtls"; sleep 1
    check sighup_reload_logged grep -q "audit tls reload ok" "$tmp/mtls.log"
    check revoked_after_sighup_fails [ "$(code $(tls alice) "https://127.0.0.1:$TP/v1/models")" = 000 ]
    check server_alive_after_sighup kill -0 "$pid_mtls"
    check plain_http_to_tls_port_fails bash -c "[ \"\$(curl -s -m 5 -o /dev/null -w '%{http_code}' http://127.0.0.1:$TP/health)\" != 200 ]"
else
    bad mtls_server_starts "$(tail -n 3 "$tmp/mtls.log" | tr '\n' ' ')"
fi
stop mtls

# --------------------------------------------------------------- bearer
ip=$(hostname -I 2>/dev/null | tr ' ' '\n' | grep -m1 -E '^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$' | grep -v '^127\.')
if [ -z "$ip" ]; then
    echo "  SKIP bearer over a non-loopback address: none on this machine (tests/test_auth.c covers the logic)"
else
    umask 077; echo "suite-Token_42" > "$tmp/token"; umask 022
    BP=$(free_port)
    check refuses_world_readable_token bash -c "cp '$tmp/token' '$tmp/token644' && chmod 644 '$tmp/token644' &&
        timeout 60 '$server' --model '$model' --host '$ip' --port $BP --auth-token-file '$tmp/token644' >'$tmp/t644.log' 2>&1;
        [ \$? -ne 0 ] && grep -q 'group/others' '$tmp/t644.log'"
    check refuses_non_loopback_without_token refuse notoken "auth-token-file" --host "$ip" --port "$BP"
    if start bearer "http://127.0.0.1:@P@" -- --host "$ip" --host 127.0.0.1 --port @P@ --auth-token-file "$tmp/token"; then
        BP=$P
        ok bearer_server_starts
        all401=1
        for r in "GET /v1/models" "GET /metrics" "POST /v1/chat/completions" "POST /v1/completions" \
                 "POST /chat/completions" "GET /nonexistent" "GET /health/"; do
            m=${r% *}; u=${r#* }
            for h in "" "Authorization: Bearer wrong-token" "Authorization: Bearer  suite-Token_42" \
                     "Authorization: Basic c3VpdGU="; do
                got=$(code -X "$m" ${h:+-H "$h"} -H 'Content-Type: application/json' --data-binary '{}' "http://$ip:$BP$u")
                [ "$got" = 401 ] && grep -q invalid_api_key "$tmp/body" || { all401=0; echo "  $r [$h] -> $got"; }
            done
        done
        check every_route_401_without_right_token [ $all401 = 1 ]
        check health_allow_listed [ "$(code "http://$ip:$BP/health")" = 200 ]
        check right_token_200 [ "$(code -H "Authorization: Bearer suite-Token_42" "http://$ip:$BP/v1/models")" = 200 ]
        check loopback_bypass [ "$(code "http://127.0.0.1:$BP/v1/models")" = 200 ]
        check deny_audit_logged grep -q "audit auth deny peer=$ip" "$tmp/bearer.log"
    else
        bad bearer_server_starts "$(tail -n 3 "$tmp/bearer.log" | tr '\n' ' ')"
    fi
    stop bearer
fi
finish
