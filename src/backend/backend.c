/* Backend-independent entry points. */
#include "sanctum/backend.h"

void sn_backend_free(sn_backend *be)
{
    if (be && be->ops && be->ops->destroy)
        be->ops->destroy(be);
}

#ifndef SN_HAVE_CUDA
/* The CUDA helper defines the real constructor under src/backend/cuda/
 * when the build has nvcc (SN_HAVE_CUDA). */
sn_status sn_backend_cuda_new(int gpu, sn_backend **out)
{
    *out = NULL;
    return SN_FAIL(SN_E_UNSUPPORTED, "CUDA backend (gpu %d): built without CUDA", gpu);
}
#endif
