#!/usr/bin/env bash
# The README's two commands. On a fresh Debian 12 machine, as root:
#   ./quickstart.sh serve   install what is needed, build, serve the default model on 127.0.0.1:8080
#   ./quickstart.sh test    install what is needed, build, run the whole test suite
set -euo pipefail
cd "$(dirname "$0")"

DEBS=(build-essential make pkg-config git curl ca-certificates openssl python3
      libevent-dev libjansson-dev libpcre2-dev libutf8proc-dev libssl-dev libcmocka-dev
      libcurl4-openssl-dev)
TEST_DEBS=(strace)

install_debs() {
    local missing=()
    for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
    [ ${#missing[@]} -eq 0 ] && return 0
    if [ "$(id -u)" -ne 0 ]; then
        echo "quickstart: missing packages (${missing[*]}); run as root or install them" >&2
        exit 1
    fi
    echo "quickstart: installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

# Optional: the OpenAI Node client check in the server suite. Machines that
# already carry a non-Debian Node.js keep it (Debian's npm would conflict).
install_node() {
    command -v npm >/dev/null 2>&1 && return 0
    [ "$(id -u)" -eq 0 ] || return 0
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null 2>&1 ||
        echo "quickstart: nodejs/npm not installed; the Node client check will SKIP"
}

jobs=$(nproc 2>/dev/null || echo 2)
case "${1:-}" in
serve)
    shift
    install_debs "${DEBS[@]}"
    make -j"$jobs"
    exec ./build/sanctum-mlx --model models/default "$@"
    ;;
test)
    install_debs "${DEBS[@]}" "${TEST_DEBS[@]}"
    install_node
    make -j"$jobs"
    # The OpenAI Node client parses our SSE in the server suite; without the
    # registry that one check SKIPs visibly and the rest still run.
    [ -d build/node/node_modules/openai ] || ! command -v npm >/dev/null 2>&1 || timeout 180 npm install --silent --no-audit --no-fund \
        --prefix build/node openai >/dev/null 2>&1 || echo "quickstart: npm openai client not installed"
    make -j"$jobs" test
    ;;
*)
    echo "usage: $0 serve [sanctum-mlx options] | test" >&2
    exit 2
    ;;
esac
