/* A ring producer that turns hostile (tests/gst/test-gst.sh hostile): makes latest-mode ring NAME
 * the library's way, waits until MEMBERS members are seated (each then waits in its take for the
 * first frame), and writes in its own control page what a hostile producer can, ringing the
 * doorbell:
 *
 *   ahead   the newest frame is 1000 past the last one, in a slot that never holds it; then stays
 *           connected until killed, so the members' ring neither closes nor loses its producer
 *   max     the newest frame is 2^64 - 1, past any frame a ring reaches; then stays
 *   gone    as ahead; a second later (the members have looked at it) closes the ring and exits
 *
 * Prints "hostile" once it wrote the page. It reaches into the library's ring (ring-internal.h) for
 * the page, as a hostile producer has its own memory.
 *
 *     hostile-producer NAME MEMBERS ahead|max|gone */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
        const char *how;
        int e;

        if (argc != 4 || (strcmp(argv[3], "ahead") && strcmp(argv[3], "max") && strcmp(argv[3], "gone"))) {
                fprintf(stderr, "usage: hostile-producer NAME MEMBERS ahead|max|gone\n");
                return 2;
        }
        members = (unsigned)atoi(argv[2]);
        how = argv[3];
        if (members < 1 || members > o.max_members) {
                fprintf(stderr, "MEMBERS: 1 to %u\n", o.max_members);
                return 2;
        }
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
        __atomic_store_n(&r->ctl->head, strcmp(how, "max") ? r->next + 1000 : UINT64_MAX, __ATOMIC_RELEASE);
        __atomic_fetch_add(&r->ctl->doorbell, 1, __ATOMIC_RELEASE);
        futex_wake(&r->ctl->doorbell, INT_MAX);
        printf("hostile\n");
        fflush(stdout);
        if (strcmp(how, "gone") == 0) {
                /* Long enough for the woken members to look at the head (a library that followed it
                 * for ever is then stuck there), whatever the wait: the close ends the ring anyway. */
                sleep(1);
                gpuipc_ring_close(r);
                gpuipc_close(c);
                printf("gone\n");
                return 0;
        }
        pause();
        return 0;
}
