/* Which implementation serves which buffer kind. */
#include "internal.h"

const KindOps *kind_ops(gpuipc_kind_t kind)
{
        switch (kind) {
        case GPUIPC_KIND_MEMFD:
                return &kind_memfd_ops;
        case GPUIPC_KIND_CUDA_VMM:
                return &kind_cuda_vmm_ops;
        case GPUIPC_KIND_CUDA_LEGACY:
                return &kind_cuda_legacy_ops;
        }
        return NULL;
}
