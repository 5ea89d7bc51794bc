/* CUDA-only entry points beyond the backend table (C API, for tests and
 * benchmarks). Every function takes a backend made by sn_backend_cuda_new;
 * passing another backend is a programmer error (asserted). A backend is
 * one stream: use it from one thread at a time (any thread). */
#ifndef SANCTUM_SN_CUDA_H
#define SANCTUM_SN_CUDA_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "sanctum/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The decode GEMVs' digit form of one row of x, on the host (no GPU
 * needed): per quant group e2 = 22 - frexp exponent of its largest |x|
 * (clamped to [-100, 100]), X = round(x * 2^e2) = 65536*d0 + 256*d1 + d2,
 * digits int8 in planes[d * cols + i]. The kernels' own helpers; for tests. */
void sn_cuda_digits_host(const float *x, int64_t cols, int group, int8_t *planes, int *e2);
/* The stream-K GEMV's work split of one launch (segments of rows[i] rows,
 * cols columns, n_sm SMs, bps blocks an SM, vw virtual warps a warp)
 * checked on the host: 0 when it holds, else 1 and the reason in why. For
 * the CPU suite. */
int sn_cuda_sk_split_check(const int64_t *rows, int n, int64_t cols, int n_sm, int bps, int vw, char *why,
                           size_t why_len);

/* True when be is a CUDA backend. */
int sn_cuda_is(const sn_backend *be);
/* Device name and memory: used (free subtracted from total, whole device)
 * and held by this backend (uploaded weights + its scratch; buffers
 * from buf_alloc are counted only in dev_used). */
sn_status sn_cuda_info(sn_backend *be, char *name, size_t name_len, size_t *dev_used, size_t *dev_total,
                       size_t *held);
/* Per-op timing of eagerly run ops with CUDA events (graphs are not timed).
 * Turning it on resets the counters; the report synchronizes and prints one
 * line per op kind: calls, total ms, share. */
void sn_cuda_profile(sn_backend *be, int on);
sn_status sn_cuda_profile_report(sn_backend *be, FILE *f);
/* cudaProfilerStart / Stop (after a sync): the range an external profiler
 * started with --profile-from-start off (ncu) records. */
sn_status sn_cuda_profiler_range(sn_backend *be, int on);
/* A kernel timeline of what runs on the device between the two calls
 * (CUPTI's concurrent-kernel activity records; libcupti loaded at run time,
 * SN_E_UNSUPPORTED where it or its headers are missing): each kernel's
 * name (mangled, cut to fit), start and end in ns on the GPU's clock, and
 * the id of the API call that launched it (one graph launch: one step).
 * begin takes the array the spans go to (max of them; more are counted in
 * end's *dropped); end synchronizes, flushes and says how many came. For
 * bench_cuda --timeline (bench/timeline.h reads a step's critical path). */
typedef struct {
    char name[128];
    uint64_t start, end;
    uint32_t corr;
} sn_cuda_kspan;
sn_status sn_cuda_timeline_begin(sn_backend *be, sn_cuda_kspan *out, int max);
sn_status sn_cuda_timeline_end(sn_backend *be, int *n, long *dropped);
/* Graph statistics: steps replayed from a graph, steps (re)captured, steps
 * that ran eagerly because something inside needed the host. */
void sn_cuda_graph_stats(sn_backend *be, long *replayed, long *captured, long *eager);
/* Recording ahead (backend.h): steps parked, and parked steps launched. */
void sn_cuda_ahead_stats(sn_backend *be, long *parked, long *launched);
/* Where a replayed decode step's time goes: while on, end_step times its
 * record match and its graph launch on the host, and the graph on the GPU
 * by events recorded around the launch. Turning it on clears the sums;
 * sn_cuda_step_times gives the means per replayed step since (microseconds). */
typedef struct {
    long steps;
    double match_us, launch_us, end_us, gpu_us;
} sn_cuda_step_time;
sn_status sn_cuda_step_timing(sn_backend *be, int on);
void sn_cuda_step_times(sn_backend *be, sn_cuda_step_time *out);
/* Nodes (kernels, copies) of the step graph captured last: what a fusion saves. */
long sn_cuda_graph_nodes(sn_backend *be);
/* Read-only streaming bandwidth of the device: reps passes of a plain
 * 16-byte-per-load reading kernel over a fresh buffer of bytes (the bound
 * a weight-streaming GEMV is measured against). */
sn_status sn_cuda_read_bandwidth(sn_backend *be, size_t bytes, int reps, double *gbs);
/* The same kernel over bytes at a time, reps launches back to back in one
 * graph, each over the next slice of a buffer of span bytes (so L2 holds
 * none of it): *us = microseconds per launch, the floor of a GEMV that
 * streams bytes of weights in one launch. */
sn_status sn_cuda_read_sweep(sn_backend *be, size_t bytes, size_t span, int reps, double *us);
/* n plain reads of bytes[i] each as a chain of launches in one graph (the
 * slices end to end through a buffer of span bytes): mode 0 plain launches,
 * 1 programmatic edges with each launch waiting after its first loads (as a
 * weight GEMV waits for x), 2 edges with the wait after all loads (the
 * launches' loads free to overlap), 3 as 1 with each launch's blocks
 * filling the SMs (no room beside them for the next launch's until they
 * leave, as behind a GEMV). *us per chain: what a step's launch
 * structure costs a stream of weights, apart from any GEMV's arithmetic. */
sn_status sn_cuda_read_chain(sn_backend *be, const size_t *bytes, int n, size_t span, int mode, int reps,
                             double *us);
/* One block of a one-token SIMT GEMV launch (k_gemv) under
 * sn_cuda_gemv_stamps, on the GPU's global timer (ns): t[0] its start,
 * t[1] the return of its wait for the kernel before, t[2] x staged (and
 * normalised), t[3] warp 0's last chunk, t[4] all its warps done; w0 the
 * launch's first weight matrix, which names the launch. */
typedef struct {
    uint64_t w0;
    uint64_t t[5];
    int64_t rows;
    int32_t block, grid;
} sn_gemv_stamp;
/* cap > 0: one-token SIMT GEMV launches take the stamped kernel from now
 * on (graphs are recaptured), with room for cap block records, cleared;
 * 0: back to the plain kernel. */
sn_status sn_cuda_gemv_stamps(sn_backend *be, int cap);
/* The records so far (at most cap), *n of them; *n may exceed what fit. */
sn_status sn_cuda_gemv_stamps_read(sn_backend *be, sn_gemv_stamp *out, int cap, int *n);

/* The decode GEMVs' pool forms (tune gemv_dyn for the SIMT GEMV,
 * gemv_sk_vw for the stream-K one): how many launches took each so far
 * (host side, counted at launch or graph capture: launches[0] SIMT,
 * [1] stream-K), and their counters on the device (counters[0..1] the
 * SIMT pool's pair, [2] the sum of the stream-K pool's slice counters and
 * [3] its block count; all 0 between launches when they work). */
sn_status sn_cuda_gemv_pool(sn_backend *be, long launches[2], int counters[4]);

/* Kernel choices for benchmarks: "gemv_rpw" = rows per warp of the
 * quantized GEMV (0: by shape, 1, 2 or 4); "cublas_min_t" = quantized GEMMs
 * of at least this many tokens go through cuBLAS (0: never; needs cuBLAS
 * loaded, see cuda_blas.cu); "fuse" = inside decode graphs, group GEMVs
 * that share x and fold the residual add after them (1, the default, or 0);
 * "gemm_fast" = prefill GEMM in one fp16 pass (1) instead of the split
 * fp16x3 form with fp32-class accuracy (0, the default; env
 * SANCTUM_CUDA_GEMM=fast sets 1 at creation); "moe_gemm" = MoE calls of
 * 32+ tokens as expert-grouped GEMMs (1, default) or per-token GEMVs (0);
 * [gemm_i8] "gemm_i8" = prefill GEMMs (T >= 9) of repacked Q4 weights with
 * x as fp16 hi + lo parts on the fp16 tensor cores (4, default: fp32-class;
 * dense weights only, MoE stacks take 3), on the integer tensor cores with
 * x as 3 byte digits (3: fp32-class), 2 digits (2: 16-bit x) or not at all
 * (0: the fp16 GEMMs above); env at creation SANCTUM_CUDA_GEMM=hilo | i8 |
 * i8fast | split | fast (the last two: 0); "gemm_hl_sub" = in the hi/lo
 * form the weights' nibbles as fp16 subnormals (1: one instruction a
 * register fewer, less accurate on the H100) or as 1024 + q less 1024 (0,
 * default); "gemm_hl_rows" = its rows a warp, 32 (default: warps of 32 x
 * 64) or 64 (warps of 64 x 32; same bits). */
sn_status sn_cuda_tune(sn_backend *be, const char *key, int value);
/* The "gemm_i8" value a SANCTUM_CUDA_GEMM value selects at creation (NULL,
 * unset: the default, 4), or -1 for a value it does not take: the one
 * mapping for the backend and for benchmarks that restore the default. */
int sn_cuda_gemm_i8_of(const char *env);

/* The optional table entries argmax, sample, moe, the steps' and recording
 * ahead's of backend.h are these functions (callers normally use the table). */
sn_status sn_cuda_argmax(sn_backend *be, const float *x, int rows, int n, int32_t *out_host);
sn_status sn_cuda_sample(sn_backend *be, float *x, int rows, int n, const sn_sample_row *rr, int32_t *out_host);
sn_status sn_cuda_moe(sn_backend *be, const sn_weight *gate, const sn_weight *up, const sn_weight *down,
                      const float *logits, int top_k, int norm_topk, const float *x, int T, float *out);
sn_status sn_cuda_begin_step(sn_backend *be);
sn_status sn_cuda_end_step(sn_backend *be);
sn_status sn_cuda_step_launch(sn_backend *be);
sn_status sn_cuda_step_wait(sn_backend *be);
sn_status sn_cuda_begin_ahead(sn_backend *be);
sn_status sn_cuda_step_park(sn_backend *be, const void *owner);
sn_status sn_cuda_step_launch_parked(sn_backend *be, const void *owner, const int32_t *ids, int n);
void sn_cuda_step_drop(sn_backend *be);

/* Prefill kernels of cuda_prefill.cu (process-wide, not per backend):
 * SN_CUDA_PREFILL_NEW (default) runs the chunked GatedDeltaNet and the
 * tensor-core flash attention for T >= min_t tokens (default 64), _OLD the
 * token-serial delta rule and the fp32 SIMT attention at every T, _GDN /
 * _ATTN only that one new. Env at first use: SANCTUM_CUDA_PREFILL=
 * new|old|gdn|attn, SANCTUM_CUDA_PREFILL_MIN_T=N. min_t <= 0 keeps it. */
enum { SN_CUDA_PREFILL_OLD = 0, SN_CUDA_PREFILL_NEW = 1, SN_CUDA_PREFILL_GDN = 2, SN_CUDA_PREFILL_ATTN = 3 };
void sn_cuda_prefill_mode(int mode, int min_t);

#ifdef __cplusplus
}
#endif

#endif
