/* Run-time CPU feature detection and kernel ISA selection.
 *
 * The binary is built for baseline x86-64; SIMD kernels live in files
 * compiled with their own flags and are only called after sn_cpu_select_isa
 * said the CPU (and the OS, which must save the wide registers) supports
 * them. SANCTUM_CPU=scalar|avx2|avx512 forces a level for tests and
 * benchmarks; forcing a level the CPU lacks is an error, never a crash. */
#ifndef SANCTUM_CPU_H
#define SANCTUM_CPU_H

#include <stdbool.h>

#include "sanctum/status.h"

typedef enum {
    SN_ISA_SCALAR = 0, /* portable C: the oracle */
    SN_ISA_AVX2 = 1,   /* AVX2 + FMA + F16C */
    SN_ISA_AVX512 = 2, /* AVX-512 F/BW/VL/DQ (+ the AVX2 set) */
    SN_ISA_COUNT
} sn_isa;

typedef struct {
    bool avx, avx2, fma, f16c;                      /* usable (CPU + OS YMM state) */
    bool avx512f, avx512bw, avx512vl, avx512dq;     /* usable (CPU + OS ZMM state) */
    bool avx512vnni;                                /* vpdpbusd (usable with avx512f) */
    bool vendor_amd, vendor_intel;                  /* from cpuid leaf 0 (kernel tuning) */
    int n_cores;                                    /* CPUs this process may run on */
} sn_cpu_features;

/* Detected once (thread-safe) and cached. */
const sn_cpu_features *sn_cpu_features_get(void);
/* True when every feature the level needs is usable here. */
bool sn_cpu_isa_supported(sn_isa isa);
/* The best supported level. */
sn_isa sn_cpu_best_isa(void);
/* The level to use: SANCTUM_CPU if set (SN_E_INVALID for an unknown name,
 * SN_E_UNSUPPORTED when this CPU lacks it), else the best supported. */
sn_status sn_cpu_select_isa(sn_isa *out);
/* "scalar", "avx2", "avx512"; parse is case-sensitive, SN_E_INVALID otherwise. */
const char *sn_isa_name(sn_isa isa);
sn_status sn_isa_parse(const char *s, sn_isa *out);

#endif
