/* Shared by the standalone GPU probes of bench/ (mma_int4_probe.cu,
 * wgmma_probe.cu, mma_f16_probe.cu), each built alone with nvcc: a CUDA call that fails ends
 * main with 1 after naming the call and the error. */
#ifndef SANCTUM_BENCH_CUDA_PROBE_H
#define SANCTUM_BENCH_CUDA_PROBE_H

#include <stdio.h>

#include <cuda_runtime.h>

#define CK(call)                                                                                                    \
    do {                                                                                                            \
        cudaError_t e_ = (call);                                                                                    \
        if (e_ != cudaSuccess) {                                                                                    \
            fprintf(stderr, "%s: %s\n", #call, cudaGetErrorString(e_));                                            \
            return 1;                                                                                               \
        }                                                                                                           \
    } while (0)

#endif
