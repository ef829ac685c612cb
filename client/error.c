/* Error codes in words: gpuipc_err_name() gives the stable short name from GPUIPC_ERRNO_MAP (the
 * codes' one table, in gpuipc.h), gpuipc_strerror() names the cause and the usual fix (the broker's
 * statuses from proto's status table, the library's own from the table below); the rest are
 * -errno. A unit test checks that the map's broker names are the protocol's. */
#include <string.h>

#include "config.h"
#include "internal.h"
#include "macro.h"

/* The fix for each of the library's own codes; the broker's come from proto/status.c. */
static const struct {
        int code;
        const char *text;
} library_texts[] = {
        { GPUIPC_E_NO_BROKER,
          "no broker answers on the socket: start gpuipc-broker, and mount its socket directory into this container "
          "at the path in GPUIPC_SOCKET" },
        { GPUIPC_E_DISCONNECTED,
          "the broker went away (it stopped or restarted); connect again (a connection made without the no_reconnect "
          "option does so by itself)" },
        { GPUIPC_E_NO_CUDA,
          "CUDA is not usable here: libcuda.so.1 could not be loaded or no GPU is visible; give the container a GPU "
          "(the same ResourceClaim as the producer) or use the memfd kind" },
        { GPUIPC_E_CUDA, "a CUDA call failed (gpuipc_errmsg() names the call and CUDA's error); check the driver "
                         "and the devices with gpuipcctl doctor" },
        { GPUIPC_E_BUSY, "the buffer is still in use: retire it and wait for drained first" },
        { GPUIPC_E_BAD_REPLY, "the broker's reply made no sense; use a client and broker of the same release" },
};

static bool is_broker_status(int err)
{
        return err <= -1001 && err >= -1099;
}

_public_ const char *gpuipc_strerror(int err)
{
        if (err == 0)
                return "success";
        if (is_broker_status(err))
                return proto_status_text((unsigned)(-err - 1000));
        for (size_t i = 0; i < ARRAY_SIZE(library_texts); i++)
                if (library_texts[i].code == err)
                        return library_texts[i].text;
        if (err < 0 && err > -4096)
                return strerror(-err);
        return "unknown error";
}

_public_ const char *gpuipc_err_name(int err)
{
        const char *name;

        switch (err) {
        case 0:
                return "ok";
#define GPUIPC_XX(code, value, text_name) \
        case value:                        \
                return text_name;
                GPUIPC_ERRNO_MAP(GPUIPC_XX)
#undef GPUIPC_XX
        }
        /* glibc's name of the errno constant; NULL for numbers it does not know. */
        name = err < 0 && err > -4096 ? strerrorname_np(-err) : NULL;
        return name ? name : "unknown";
}

_public_ const char *gpuipc_version(void)
{
        return GPUIPC_VERSION;
}
