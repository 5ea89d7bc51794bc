#!/usr/bin/env bash
# The CPU-only build: a machine without nvcc (a fresh Debian 12, as the
# README's Quick start has it) builds with SN_CUDA=0, so every C file with
# an SN_HAVE_CUDA branch must also compile, warning-free, with that branch
# off. The suite's own build may have CUDA on, so each such file is
# compiled here once more with the Makefile's flags less CUDA's define
# (make cpu-cflags), the objects discarded.
# Usage: suite_cpu_build.sh [BUILD]   Ends with "N passed, N failed".
set -u
cd "$(dirname "$0")/.."
pass=0; fail=0
err=$(mktemp); trap 'rm -f "$err"' EXIT
read -ra flags <<< "$(env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -s --no-print-directory cpu-cflags)" # not make test's jobserver
[ ${#flags[@]} -gt 0 ] || { echo "FAIL make cpu-cflags printed nothing"; echo "0 passed, 1 failed"; exit 0; }
for f in $(grep -rl SN_HAVE_CUDA src tools tests bench --include='*.c' | sort); do
    if cc "${flags[@]}" -Itests -c -o /dev/null "$f" 2> "$err"; then
        echo "ok   $f compiles without CUDA"; pass=$((pass + 1))
    else
        echo "FAIL $f does not compile without CUDA:"; head -n 5 "$err"; fail=$((fail + 1))
    fi
done
[ $((pass + fail)) -gt 0 ] || { echo "FAIL no file with an SN_HAVE_CUDA branch found"; fail=1; }
echo "$pass passed, $fail failed"
