/* A pipeline's producer: a ring of K host buffers carries F frames to M consumers. Each frame is
 * published under its own name with retire_after = M, so it retires itself once every consumer
 * attached it; the producer writes into a slot again only after that slot drained, so no consumer
 * ever sees a frame being overwritten. Build: see examples/meson.build; run: run-pipeline.sh. */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpuipc.h"
#include "frame.h"

static double now_s(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int die(gpuipc_t *c, const char *what, int r)
{
        fprintf(stderr, "producer: %s: %s\n  (%s)\n", what, gpuipc_errmsg(c), gpuipc_strerror(r));
        return 1;
}

int main(int argc, char **argv)
{
        Options o = options_parse(argc, argv);
        gpuipc_buffer_t **slots = calloc(o.slots, sizeof(*slots));
        gpuipc_publish_options_t po = { .struct_size = sizeof(po), .retire_after = o.consumers };
        gpuipc_t *c;
        double start;
        int r;

        r = gpuipc_connect(&c, &(gpuipc_options_t){ .struct_size = sizeof(gpuipc_options_t),
                                                    .label = "pipeline-producer",
                                                    .connect_timeout_ms = 5000,
                                                    .no_gpus = 1 });
        if (r < 0)
                return die(NULL, "connect", r);
        for (unsigned s = 0; s < o.slots; s++) {
                r = gpuipc_buffer_alloc(c, GPUIPC_KIND_MEMFD, o.frame_size, 0, &slots[s]);
                if (r < 0)
                        return die(c, "allocate a slot", r);
        }
        /* Everyone starts together: the clock measures frames, not start-up. */
        r = gpuipc_group_join(c, o.group, o.consumers + 1, 30000);
        if (r < 0)
                return die(c, "wait for the consumers", r);

        start = now_s();
        for (uint64_t f = 0; f < o.frames; f++) {
                gpuipc_buffer_t *b = slots[f % o.slots];
                char name[256];

                /* Reuse a slot only once every consumer let go of its previous frame. */
                r = gpuipc_wait_drained(c, b, 30000);
                if (r < 0)
                        return die(c, "wait for a slot to drain", r);
                frame_write(gpuipc_buffer_ptr(b), o.frame_size, f);
                frame_name(name, sizeof(name), o.prefix, f);
                r = gpuipc_publish(c, b, name, &po);
                if (r < 0)
                        return die(c, "publish", r);
        }
        for (unsigned s = 0; s < o.slots; s++) {
                r = gpuipc_wait_drained(c, slots[s], 30000);
                if (r < 0)
                        return die(c, "wait for the last frames to drain", r);
        }
        printf("producer: %" PRIu64 " frames of %zu bytes through %u slots to %u consumers in %.3f s: %.0f frames/s\n",
               o.frames, o.frame_size, o.slots, o.consumers, now_s() - start, (double)o.frames / (now_s() - start));
        for (unsigned s = 0; s < o.slots; s++)
                gpuipc_buffer_free(c, slots[s]);
        free(slots);
        gpuipc_close(c);
        return 0;
}
