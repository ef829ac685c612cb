/* gpuipc_strerror: every error code in a sentence that names the cause and the usual fix. */
#include <string.h>

#include "internal.h"
#include "macro.h"

_public_ const char *gpuipc_strerror(int err)
{
        if (err <= -1001 && err >= -1099)
                return proto_status_text((unsigned)(-err - 1000));
        switch (err) {
        case 0:
                return "success";
        case GPUIPC_E_NO_BROKER:
                return "no broker answers on the socket: start gpuipc-broker, and mount its socket directory into "
                       "this container at the path in GPUIPC_SOCKET";
        case GPUIPC_E_DISCONNECTED:
                return "the broker went away (it stopped or restarted); reconnect, or connect with the reconnect "
                       "option to do so automatically";
        case GPUIPC_E_NO_CUDA:
                return "CUDA is not usable here: libcuda.so.1 could not be loaded or no GPU is visible; give the "
                       "container a GPU (the same ResourceClaim as the producer) or use the memfd kind";
        case GPUIPC_E_CUDA:
                return "a CUDA call failed; gpuipc_errmsg() names the call and CUDA's error";
        case GPUIPC_E_BUSY:
                return "the buffer is still in use: retire it and wait for drained first";
        case GPUIPC_E_BAD_REPLY:
                return "the broker's reply made no sense; use a client and broker of the same release";
        }
        if (err < 0 && err > -4096)
                return strerror(-err);
        return "unknown error";
}
