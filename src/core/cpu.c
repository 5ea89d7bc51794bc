/* CPU feature detection (cpuid + xgetbv) and ISA selection. */
#include "sanctum/cpu.h"

#include <pthread.h>
#include <sched.h>
#include <string.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define SN_X86 1
#endif

static sn_cpu_features g_feat;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

#ifdef SN_X86
/* XCR0 tells which register files the OS saves on a context switch; a CPU
 * with AVX-512 under an OS (or hypervisor) that does not save ZMM state must
 * not run AVX-512 code. Read with the raw opcode so no -mxsave is needed. */
static unsigned long long read_xcr0(void)
{
    unsigned int eax, edx;
    __asm__ volatile(".byte 0x0f, 0x01, 0xd0" : "=a"(eax), "=d"(edx) : "c"(0));
    return ((unsigned long long)edx << 32) | eax;
}
#endif

static void detect(void)
{
    memset(&g_feat, 0, sizeof g_feat);
#ifdef SN_X86
    unsigned int a, b, c, d;
    if (__get_cpuid(0, &a, &b, &c, &d)) {
        char v[13];
        memcpy(v, &b, 4);
        memcpy(v + 4, &d, 4);
        memcpy(v + 8, &c, 4);
        v[12] = 0;
        g_feat.vendor_amd = strcmp(v, "AuthenticAMD") == 0;
        g_feat.vendor_intel = strcmp(v, "GenuineIntel") == 0;
    }
    if (__get_cpuid(1, &a, &b, &c, &d)) {
        bool osxsave = c & (1u << 27);
        bool cpu_avx = c & (1u << 28);
        bool cpu_fma = c & (1u << 12);
        bool cpu_f16c = c & (1u << 29);
        unsigned long long xcr0 = osxsave ? read_xcr0() : 0;
        bool ymm_ok = (xcr0 & 0x6) == 0x6;          /* SSE + AVX state */
        bool zmm_ok = ymm_ok && (xcr0 & 0xe0) == 0xe0; /* opmask + ZMM hi256 + hi16 */
        g_feat.avx = cpu_avx && ymm_ok;
        g_feat.fma = cpu_fma && g_feat.avx;
        g_feat.f16c = cpu_f16c && g_feat.avx;
        unsigned int max_leaf = __get_cpuid_max(0, NULL);
        if (max_leaf >= 7) {
            __cpuid_count(7, 0, a, b, c, d);
            g_feat.avx2 = (b & (1u << 5)) && g_feat.avx;
            g_feat.avx512f = (b & (1u << 16)) && zmm_ok;
            g_feat.avx512dq = (b & (1u << 17)) && zmm_ok;
            g_feat.avx512bw = (b & (1u << 30)) && zmm_ok;
            g_feat.avx512vl = (b & (1u << 31)) && zmm_ok;
            g_feat.avx512vnni = (c & (1u << 11)) && zmm_ok;
        }
    }
#endif
    cpu_set_t set;
    int n = 0;
    if (sched_getaffinity(0, sizeof set, &set) == 0)
        n = CPU_COUNT(&set);
    if (n <= 0) {
        long m = sysconf(_SC_NPROCESSORS_ONLN);
        n = m > 0 ? (int)m : 1;
    }
    g_feat.n_cores = n;
}

const sn_cpu_features *sn_cpu_features_get(void)
{
    pthread_once(&g_once, detect);
    return &g_feat;
}

bool sn_cpu_isa_supported(sn_isa isa)
{
    const sn_cpu_features *f = sn_cpu_features_get();
    bool avx2 = f->avx2 && f->fma && f->f16c;
    switch (isa) {
    case SN_ISA_SCALAR: return true;
    case SN_ISA_AVX2: return avx2;
    case SN_ISA_AVX512: return avx2 && f->avx512f && f->avx512bw && f->avx512vl && f->avx512dq;
    default: return false;
    }
}

sn_isa sn_cpu_best_isa(void)
{
    if (sn_cpu_isa_supported(SN_ISA_AVX512)) return SN_ISA_AVX512;
    if (sn_cpu_isa_supported(SN_ISA_AVX2)) return SN_ISA_AVX2;
    return SN_ISA_SCALAR;
}

const char *sn_isa_name(sn_isa isa)
{
    switch (isa) {
    case SN_ISA_SCALAR: return "scalar";
    case SN_ISA_AVX2: return "avx2";
    case SN_ISA_AVX512: return "avx512";
    default: return "?";
    }
}

sn_status sn_isa_parse(const char *s, sn_isa *out)
{
    for (int i = 0; i < SN_ISA_COUNT; i++) {
        if (s && strcmp(s, sn_isa_name((sn_isa)i)) == 0) {
            *out = (sn_isa)i;
            return SN_OK;
        }
    }
    return SN_FAIL(SN_E_INVALID, "unknown CPU level '%s' (expected scalar, avx2 or avx512)", s ? s : "(null)");
}

sn_status sn_cpu_select_isa(sn_isa *out)
{
    const char *env = getenv("SANCTUM_CPU");
    if (!env || !*env) {
        *out = sn_cpu_best_isa();
        return SN_OK;
    }
    sn_isa isa;
    sn_status st = sn_isa_parse(env, &isa);
    if (st != SN_OK)
        return SN_FAIL(st, "SANCTUM_CPU=%s: expected scalar, avx2 or avx512", env);
    if (!sn_cpu_isa_supported(isa))
        return SN_FAIL(SN_E_UNSUPPORTED, "SANCTUM_CPU=%s: this CPU (or OS) does not support it (best: %s)",
                       env, sn_isa_name(sn_cpu_best_isa()));
    *out = isa;
    return SN_OK;
}
