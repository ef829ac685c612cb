/* A pipeline's consumer: attaches every frame by name (waiting for it to be published), checks
 * it, and releases it. Attaching a slot it has seen before costs one round trip and no mapping:
 * the library keeps the mapping, and the broker knows not to send the fd again. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "gpuipc.h"
#include "frame.h"

static int die(gpuipc_t *c, const char *what, int r)
{
        fprintf(stderr, "consumer: %s: %s\n  (%s)\n", what, gpuipc_errmsg(c), gpuipc_strerror(r));
        return 1;
}

int main(int argc, char **argv)
{
        Options o = options_parse(argc, argv);
        uint64_t bad = 0;
        gpuipc_t *c;
        int r;

        r = gpuipc_connect(&c, &(gpuipc_options_t){ .struct_size = sizeof(gpuipc_options_t),
                                                    .label = "pipeline-consumer",
                                                    .connect_timeout_ms = 5000,
                                                    .no_gpus = 1 });
        if (r < 0)
                return die(NULL, "connect", r);
        r = gpuipc_group_join(c, o.group, o.consumers + 1, 30000);
        if (r < 0)
                return die(c, "wait for the producer", r);
        for (uint64_t f = 0; f < o.frames; f++) {
                gpuipc_buffer_t *b;
                char name[256];

                frame_name(name, sizeof(name), o.prefix, f);
                r = gpuipc_attach(c, name, 30000, &b);
                if (r < 0)
                        return die(c, "attach", r);
                if (!frame_check(gpuipc_buffer_ptr(b), gpuipc_buffer_size(b), f, o.full_check))
                        bad++;
                r = gpuipc_release(c, b);
                if (r < 0)
                        return die(c, "release", r);
        }
        printf("consumer %u: %" PRIu64 " frames, %" PRIu64 " failed verification\n", o.index, o.frames, bad);
        gpuipc_close(c);
        return bad ? 1 : 0;
}
