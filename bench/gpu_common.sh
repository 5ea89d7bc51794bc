# Sourced by bench/gpu_ab.sh, gpu_bisect.sh, gpu_call.sh, gpu_engine_ab.sh, gpu_record.sh and gpu_vary.sh: the pieces every
# "pack here, run on the GPU box" script shares. The box builds nothing and
# lacks a few shared libraries, so binaries travel as one xz tar (one
# dictionary over all of them: each carries the same ~12 MB of device code)
# beside the libraries they need.

# bench_cuda of the tree $1 (built: $1/build/libsanctum.a) into $2
gpu_bench_cc() {
    cc -std=c17 -D_GNU_SOURCE -O2 -Wall -Wextra -Werror -Wno-unused-parameter -I"$1/include" -I"$1/src" -pthread \
        -DSN_HAVE_CUDA=1 -o "$2" "$1/bench/bench_cuda.c" "$1/build/libsanctum.a" -lm -lpthread -ljansson \
        -L/usr/local/cuda/lib64 -L/usr/local/cuda/targets/x86_64-linux/lib -lcudart_static -lrt -lstdc++ -ldl
}

# $1/bin/* stripped, the libraries the box lacks (it has jansson, PCRE2,
# OpenSSL 3, curl and newer system libraries) copied to $1/lib, and the
# binaries packed into $1/bin.tar.xz
gpu_pack_bins() {
    strip "$1"/bin/* || true
    for b in "$1"/bin/*; do ldd "$b"; done | awk '/=> \//{print $3}' | sort -u |
        grep -E '/(libevent|libutf8proc|libcmocka)[^/]*\.so' | while read -r l; do cp -L "$l" "$1/lib/"; done
    (cd "$1" && tar cf - bin | xz --lzma2=preset=6,dict=256MiB -T1 > bin.tar.xz && rm -rf bin)
}

# On the box: $1/bin unpacked and its libraries on the loader's path
gpu_unpack() {
    export LD_LIBRARY_PATH="$PWD/$1/lib"
    tar xJf "$1/bin.tar.xz" -C "$1"
}

# On the box, a run's start: out ($OUT, default /tmp/out) for what comes
# back, the work folder w ($2, emptied), and pack $1 unpacked, its
# binaries in B (globals, for the run's script)
gpu_run_begin() {
    out=${OUT:-/tmp/out}
    w=$2
    rm -rf "$w" && mkdir -p "$out" "$w"
    gpu_unpack "$1"
    B=$1/bin
}

# a bench_cuda --ncu-decode log's ms per decode step (empty if it failed)
gpu_step_ms() {
    grep -oE 'decode \(graph\) [0-9.]+ ms per step' "$1" | head -1 | grep -oE '[0-9.]+ ms' | cut -d' ' -f1
}

# bench_cuda's timed decode steps, as every A/B, bisect and vary run takes
# them: BIN CONFIG CTX LIMIT_S [more bench_cuda arguments...], under timeout
gpu_decode() {
    local bin=$1 cfg=$2 ctx=$3 lim=$4
    shift 4
    timeout "$lim" "$bin" --config "$cfg" --prefill "$ctx" --decode 32 --ncu-decode --no-profile "$@"
}

# a --vary log's round lines ("round R KNOB decode (graph) MS ms per step ..."), spaces squeezed
gpu_rounds() {
    grep -E '^  round' "$1" | sed -E 's/ +/ /g'
}

# a pack's vary file (one key=value:restore[,...] a line) as --vary arguments, into the array va
gpu_vary_args() {
    va=()
    while read -r v; do va+=(--vary "$v"); done < "$1"
}
