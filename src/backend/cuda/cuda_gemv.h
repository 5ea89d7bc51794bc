/* The SIMT decode GEMV of cuda_gemv.cu (issue 6), as cuda_matmul.cu's
 * dispatch uses it: MLX words as stored, up to CU_GROUP_MAX matrices that
 * read the same x in one launch, T <= 8 tokens per pass over the weights. */
#ifndef SANCTUM_CUDA_GEMV_H
#define SANCTUM_CUDA_GEMV_H

#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/sn_cuda.h"

/* The segments of one launch, filled by the caller (W, sb, bias, y, add_to,
 * rows, n and the optional norm); g0 by cu_gv_run. */
struct gemv_seg {
    const uint32_t *W[CU_GROUP_MAX];
    const void *sb[CU_GROUP_MAX];
    const float *bias[CU_GROUP_MAX];
    float *y[CU_GROUP_MAX];
    float *add_to[CU_GROUP_MAX];
    int64_t rows[CU_GROUP_MAX];
    int64_t g0[CU_GROUP_MAX + 1]; /* first row group of segment i; g0[n] = all groups */
    int n;
    /* optional fused RMSNorm of x (nw != NULL): x_n = x * inv_rms * nw */
    const float *nw;
    float eps;
    int norm_threads; /* the thread count whose sum order the norm reproduces */
    float *xn;        /* where block 0 writes x_n (may be NULL) */
    /* segment 0 is a GDN layer's qkv projection whose conv the epilogue
     * folds (cv.w != NULL; dp4a form, one pass: cu_gv_folds_conv) */
    cu_gemv_conv cv;
    int npre;         /* ring chunks per warp issued before x is read (cu_gv_run sets it) */
    uint32_t gmag;    /* ceil(2^32 / group), for the chunk's quant group (cu_gv_run sets it) */
    /* the pool form (k_gemv<..., DY>, gv_launch sets these): the first gst
     * row groups are dealt to the warps as usual, the rest taken one at a
     * time from pool[0]; pool[1] counts the warps that found it empty, and
     * the last of them zeroes both for the next launch (k_gemv<..., 2>,
     * tune gemv_dyn_lean: a take that a plain load shows would fail is not
     * made, and pool[1] counts blocks, not warps) */
    int64_t gst;
    int *pool;
};

/* Whether a launch of T tokens through w0 can fold a GDN conv (g.cv). */
bool cu_gv_folds_conv(const cu_devinfo *di, const cu_weight *w0, int T);
/* T tokens (passes of up to 8) through g's segments. */
sn_status cu_gv_run(const cu_devinfo *di, cudaStream_t s, gemv_seg g, const cu_weight *w0, const float *x, int T);
/* The stamped k_gemv (sn_cuda_gemv_stamps): on with room for cap records
 * (buf on the device), cleared; cap 0 off; *changed (may be NULL) whether
 * that switched the kernel launched. And the records' count. */
sn_status cu_gv_stamps(sn_gemv_stamp *buf, int cap, bool *changed);
sn_status cu_gv_stamps_count(int *n);
/* launches of the pool form so far (sn_cuda_gemv_pool) */
long cu_gv_pool_launches(void);
/* From cu_matmul_init: the kernels' shared memory limits. */
sn_status cu_gemv_init(const cu_devinfo *di);

#endif
