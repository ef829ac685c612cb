/* A ring's shared memory as operators see it (the ring-stat and rings replies): the control page
 * and the member pages, mapped read-only for the one request that reads them and unmapped before it
 * returns. The broker keeps no mapping of a peer's memory, and what it reads there is the other
 * sides' (the producer writes the control page, each member its page): proto/ring.c's ring_read
 * checks and clamps it.
 *
 * Mapping cannot fault: the pages are memfds of exactly RING_PAGE bytes sealed against shrinking,
 * checked when the producer registered them (request.c's check_memfd, registry-rings.c). */
#include "ringview.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

/* The page behind fd, read-only, or NULL (errno set). */
static const void *page_map(int fd)
{
        void *p;

        if (fd < 0) {
                errno = ENOENT;
                return NULL;
        }
        p = mmap(NULL, RING_PAGE, PROT_READ, MAP_SHARED, fd, 0);
        return p == MAP_FAILED ? NULL : p;
}

static void page_unmap(const void *p)
{
        if (p)
                munmap((void *)p, RING_PAGE);
}

static void why_not(RingView *ret, const RegRingView *g, int map_errno)
{
        if (g->ctl_fd < 0)
                snprintf(ret->why, sizeof(ret->why), "its producer has not registered the control page yet");
        else if (map_errno)
                snprintf(ret->why, sizeof(ret->why), "the broker could not map the control page: %s",
                         strerror(map_errno));
        else
                snprintf(ret->why, sizeof(ret->why), "the control page does not hold a ring of this shape (not "
                         "written yet, or broken): %s", ret->reading.why);
}

void ringview_read(const RegRingView *g, RingView *ret)
{
        const volatile RingMember *pages[RING_MAX_MEMBERS] = { 0 };
        uint64_t epochs[RING_MAX_MEMBERS] = { 0 };
        const volatile RingCtl *ctl;

        memset(ret, 0, sizeof(*ret));
        ctl = page_map(g->ctl_fd);
        if (!ctl) {
                why_not(ret, g, g->ctl_fd < 0 ? 0 : errno);
                return;
        }
        ret->pages = 1;
        for (uint32_t i = 0; i < g->n_members && i < RING_MAX_MEMBERS; i++) {
                epochs[i] = g->seats[i].epoch;
                if (!epochs[i])
                        continue;
                /* A page that cannot be mapped reads as one that does not speak for its seat. */
                pages[i] = page_map(g->seats[i].page_fd);
                ret->pages += pages[i] != NULL;
        }
        ring_read(ctl, g->n_slots, g->n_members, g->slot_size, (RingMode)(g->mode - 1), epochs, pages, &ret->reading);
        for (uint32_t i = 0; i < RING_MAX_MEMBERS; i++)
                page_unmap((const void *)pages[i]);
        page_unmap((const void *)ctl);
        if (!ret->reading.ctl_valid)
                why_not(ret, g, 0);
}
