/* Placeholder until the CUDA driver loader lands: reports no GPUs. */
#include "internal.h"

uint32_t cuda_visible_gpus(char out[][PROTO_MAX_UUID + 1], uint32_t max)
{
        (void)out;
        (void)max;
        return 0;
}
