/* The CUDA backend's state and the helpers its files share: the op
 * records of a step, the cached step graphs, and cuda_be itself, which
 * cuda_backend.cu drives (ops, upload, graphs) and cuda_measure.cu reads and
 * tunes (profiling, sn_cuda_tune, the bandwidth probe). */
#ifndef SANCTUM_CUDA_BE_H
#define SANCTUM_CUDA_BE_H

#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/sn_cuda.h"

enum rec_kind {
    R_MATMUL, R_EMBED, R_RMSNORM, R_GRMSNORM, R_ADD, R_SWIGLU, R_MULSIG, R_ROPE, R_KVWRITE, R_ATTN, R_GDN,
    R_COPY, R_MEMSET, R_ARGMAX, R_MOE, R_ADDGATED, R_COUNT
};
inline const char *const rec_names[R_COUNT] = { "matmul", "embed", "rmsnorm", "gated_rmsnorm", "add",
                                                "swiglu", "mul_sigmoid", "rope", "kv_write", "attention",
                                                "gdn", "copy", "memset0", "argmax", "moe", "add_gated" };

/* One op call. Zero-initialised before filling, so memcmp compares it. */
struct rec {
    int kind;
    int has_pos;
    int pos0;
    int pad;
    const void *p[10];
    int64_t i[8];
    float f[4];
};

constexpr int STEP_MAX_IDS = 4096;
constexpr int STEP_MAX_OUTS = 1024;

struct step_params {
    int delta;
    int pad[31];
    int32_t ids[STEP_MAX_IDS];
};

struct prof_ev {
    int kind;
    cudaEvent_t a, b;
};

/* A captured step graph and the record it was captured from. */
struct gslot {
    rec *recs;
    int n, cap;
    bool valid;
    cudaGraphExec_t exec;
    size_t nodes; /* of the graph exec was made from */
    uint64_t shape; /* its graph_shape: kernels and edge kinds in order */
    long used;
    long gen; /* which capture it holds (a record matched against it stays matched while gen does) */
};
constexpr int GRAPH_SLOTS = 8;

struct cuda_be {
    sn_backend base; /* first: the table's sn_backend * is this struct */
    int dev;
    cu_devinfo di;
    char name[256];
    cudaStream_t st;
    size_t held;
    cu_weight *weights;

    void *scratch;
    size_t scratch_cap;
    int *d_zero;            /* constant 0: the delta outside graphs */
    int *d_gdn_cnt;         /* CU_GDN_CNT zeroed counters of the one-kernel GDN step */
    unsigned *d_moe_sync;   /* CU_MOE_SYNC zeroed: the MoE down kernel's early start (cuda_moe.h) */
    int32_t *d_ids;         /* eager embed ids */
    size_t ids_cap;
    int32_t *d_outs;        /* argmax results [STEP_MAX_OUTS] */
    int32_t *h_outs;        /* pinned mirror */
    step_params *d_sp, *h_sp;
    /* draws (cuda_sample.cu): parameters (device and pinned mirror) and
     * the softmax numerators, grown on demand */
    void *smp_d, *smp_h;
    size_t smp_cap;
    void *smp_e;
    size_t smp_e_cap;

    /* step recording */
    bool in_step, broken;
    rec *recs;
    int n_recs, cap_recs;
    int32_t pend_ids[STEP_MAX_IDS];
    int n_ids;
    int32_t *out_ptrs[STEP_MAX_OUTS]; /* host destinations of argmax rows */
    int n_outs;
    /* recording ahead (backend.h): the step open is one to park, not run
     * (ahead), and something in it asked for the host (ahead_bad) */
    bool ahead, ahead_bad;
    /* a step queued by step_launch whose outputs step_wait delivers */
    bool launched;
    int32_t *l_out_ptrs[STEP_MAX_OUTS];
    int l_n_outs;
    long l_rep;       /* n_replayed before its launch: timed only if it replayed */
    double l_t_end;   /* when its end began (step timing) */
    /* the parked record: the op records, ids and argmax destinations of a step begun ahead */
    struct {
        bool valid;
        const void *owner;
        rec *recs;
        int n_recs, cap;
        int32_t ids[STEP_MAX_IDS];
        int n_ids;
        int32_t *out_ptrs[STEP_MAX_OUTS];
        int n_outs;
        /* the graph slot it matched when parked (matched while the GPU ran
         * the step before), its capture and delta; slot -1: none matched */
        int slot, delta;
        long gen;
    } park;
    /* launch_step's match found ahead of time (park): slot -1 when none */
    int hint_slot, hint_delta;
    long hint_gen;

    /* the cached graphs: one per step shape seen lately (a decode step, and
     * prompt-lookup verify steps of 2..8 rows), least recently used replaced */
    gslot gs[GRAPH_SLOTS];
    long g_clock;
    long g_gen; /* captures made: each slot's gen */
    long n_replayed, n_captured, n_eager;
    long n_parked, n_parked_launched; /* recording ahead: steps parked, parked steps launched */
    long last_nodes; /* nodes of the graph captured last */
    /* sn_cuda_step_timing: where a replayed step's wall time goes (host seconds, GPU ms summed
     * over the replays timed; events around the graph launch only while on) */
    struct {
        bool on;
        cudaEvent_t a, b;
        long n;
        double match_s, launch_s, end_s, gpu_ms;
    } stime;

    int fuse;               /* group decode GEMVs and fold residual adds inside graphs */
    int fuse_gate;          /* and the gates: a GDN layer's gated norm into its out projection, the
                             * attention's output gate into its combine (tune "fuse_gate") */
    int fuse_conv;          /* and a GDN layer's conv into its qkv projection (tune "fuse_conv") */

    /* The x the integer prefill GEMM last staged into scratch (its digit
     * planes). Consecutive eager matmuls of one x (q/k/v, qkv/z/b/a,
     * shared gate/up) stage it once; anything else that runs, or any
     * write the backend sees, forgets it (stg_forget). */
    struct {
        bool valid;
        const void *x, *scratch;
        int64_t T, cols, group;
        int digits;
    } stg;

    /* profiling */
    bool prof;
    prof_ev *evs;
    int n_evs, cap_evs;
};

inline void stg_forget(cuda_be *cb) { cb->stg.valid = false; }

inline cuda_be *cb_of(sn_backend *b) { return (cuda_be *)b; }

/* Every cached graph holds pointers and kernel choices: any change to those drops them all. */
inline void graphs_invalidate(cuda_be *cb)
{
    for (int i = 0; i < GRAPH_SLOTS; i++)
        cb->gs[i].valid = false;
}

inline sn_status cu_err(cudaError_t e, const char *what)
{
    return SN_FAIL(SN_E_BACKEND, "cuda %s: %s", what, cudaGetErrorString(e));
}

/* Ops that need the host: inside a step, run what is pending first. */
sn_status host_barrier(cuda_be *cb);

#endif
