#!/usr/bin/env bash
# Builds bench/bench_tok.c against build/libsanctum.a, runs it on the vendored
# Qwen3 tokenizer.json, and appends the result with this command to
# bench/results.log. Extra arguments go to bench_tok (--file TEXT, --mb N).
set -euo pipefail
cd "$(dirname "$0")/.."
make -s build/libsanctum.a
mkdir -p build/bench
cc -std=c17 -D_GNU_SOURCE -O2 -Wall -Wextra -Werror -Iinclude -o build/bench/bench_tok bench/bench_tok.c \
    build/libsanctum.a -ljansson -lpcre2-8 -lutf8proc -lm -lpthread
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
gzip -dc tests/fixtures/tokenizer/qwen3/tokenizer.json.gz > "$tmp/tokenizer.json"
status=0
line=$(./build/bench/bench_tok --tokenizer "$tmp/tokenizer.json" "$@") || status=$?
echo "$line"
{
    echo "$(date -u +%Y-%m-%dT%H:%M:%SZ) $(git rev-parse --short HEAD 2>/dev/null || echo '?') $(nproc) cpus"
    echo "  cmd: bench/bench_tok.sh $*"
    echo "  $line"
} >> bench/results.log
exit $status
