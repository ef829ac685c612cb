/* A ring producer that turns hostile (tests/gst/test-gst.sh hostile): makes latest-mode ring NAME
 * the library's way, waits until MEMBERS members are seated, then says in its own control page that
 * the newest frame is 1000 past the last one, in a slot that never holds it, and rings the
 * doorbell: what a hostile producer can write there. Prints "hostile" then, and stays connected
 * until killed, so the members' ring neither closes nor loses its producer. It reaches into the
 * library's ring (ring-internal.h) for the page, as a hostile producer has its own memory.
 *
 *     hostile-producer NAME MEMBERS */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "futex.h"
#include "ring-internal.h"

static unsigned seated(const gpuipc_ring_t *r)
{
        unsigned n = 0;

        for (uint32_t i = 0; i < r->n_members; i++)
                n += __atomic_load_n(&r->ctl->member[i].state, __ATOMIC_ACQUIRE) == RING_MEMBER_ACTIVE;
        return n;
}

int main(int argc, char **argv)
{
        gpuipc_ring_options_t o = { .struct_size = sizeof(o), .slot_size = 4096, .slots = 4, .max_members = 2,
                                     .mode = GPUIPC_RING_LATEST };
        gpuipc_ring_t *r;
        gpuipc_t *c;
        unsigned members;
        int e;

        if (argc != 3) {
                fprintf(stderr, "usage: hostile-producer NAME MEMBERS\n");
                return 2;
        }
        members = (unsigned)atoi(argv[2]);
        e = gpuipc_connect(&c, NULL);
        if (e < 0) {
                fprintf(stderr, "connect: %s\n", gpuipc_errmsg(NULL));
                return 1;
        }
        e = gpuipc_ring_create(c, argv[1], &o, &r);
        if (e < 0) {
                fprintf(stderr, "ring-create: %s\n", gpuipc_errmsg(c));
                return 1;
        }
        /* The library's ring thread seats members as the broker announces them. */
        for (int i = 0; seated(r) < members; i++) {
                if (i == 60000) {
                        fprintf(stderr, "%u of %u members seated after 60 s\n", seated(r), members);
                        return 1;
                }
                usleep(1000);
        }
        __atomic_store_n(&r->ctl->head_slot, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&r->ctl->head, r->next + 1000, __ATOMIC_RELEASE);
        __atomic_fetch_add(&r->ctl->doorbell, 1, __ATOMIC_RELEASE);
        futex_wake(&r->ctl->doorbell, INT_MAX);
        printf("hostile\n");
        fflush(stdout);
        pause();
        return 0;
}
