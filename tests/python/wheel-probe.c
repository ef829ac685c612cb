/* The aarch64 wheel's library at work (tests/python/test-wheel.sh builds this for aarch64 and runs
 * it under qemu-user): loads gpuipc/libgpuipc.so the way the Python package does (dlopen, as
 * ctypes), connects to the x86_64 broker, publishes a 4 KiB memfd buffer of 0x5a bytes for one
 * attach, and waits until it drained, printing "published" and "drained".
 *   wheel-probe LIBGPUIPC_SO SOCKET NAME     exit 0 when drained */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "gpuipc.h"

#define LOAD(name) typeof(name) *p_##name = (typeof(name) *)dlsym(lib, #name)

int main(int argc, char **argv)
{
        gpuipc_options_t o = { .struct_size = sizeof(o), .no_gpus = 1, .connect_timeout_ms = 5000 };
        gpuipc_publish_options_t po = { .struct_size = sizeof(po), .retire_after = 1 };
        gpuipc_buffer_t *b;
        gpuipc_t *c;
        void *lib;
        int r;

        if (argc != 4) {
                fprintf(stderr, "usage: wheel-probe LIBGPUIPC_SO SOCKET NAME\n");
                return 2;
        }
        lib = dlopen(argv[1], RTLD_NOW);
        if (!lib) {
                fprintf(stderr, "dlopen: %s\n", dlerror());
                return 1;
        }
        LOAD(gpuipc_version);
        LOAD(gpuipc_connect);
        LOAD(gpuipc_errmsg);
        LOAD(gpuipc_buffer_alloc);
        LOAD(gpuipc_buffer_ptr);
        LOAD(gpuipc_publish);
        LOAD(gpuipc_wait_drained);
        LOAD(gpuipc_buffer_free);
        LOAD(gpuipc_close);
        printf("libgpuipc %s\n", p_gpuipc_version());
        o.socket_path = argv[2];
        o.label = "wheel-probe";
        if ((r = p_gpuipc_connect(&c, &o)) < 0) {
                fprintf(stderr, "connect: %d %s\n", r, p_gpuipc_errmsg(NULL));
                return 1;
        }
        if ((r = p_gpuipc_buffer_alloc(c, GPUIPC_KIND_MEMFD, 4096, 0, &b)) < 0 ||
            (memset(p_gpuipc_buffer_ptr(b), 0x5a, 4096), r = p_gpuipc_publish(c, b, argv[3], &po)) < 0) {
                fprintf(stderr, "publish: %d %s\n", r, p_gpuipc_errmsg(c));
                return 1;
        }
        printf("published\n");
        fflush(stdout);
        if ((r = p_gpuipc_wait_drained(c, b, 30000)) < 0) {
                fprintf(stderr, "wait drained: %d %s\n", r, p_gpuipc_errmsg(c));
                return 1;
        }
        printf("drained\n");
        p_gpuipc_buffer_free(c, b);
        p_gpuipc_close(c);
        return 0;
}
