/* Reading a ring's shared memory for listings (ringview.c). */
#pragma once

#include "registry.h"
#include "ring.h"

typedef struct RingView {
        RingReading reading; /* reading.ctl_valid false: the head and positions are unknown, */
        char why[256];       /* ... and this says why */
        unsigned pages;      /* pages mapped (and unmapped) to read it: what the read cost */
} RingView;

/* Maps g's control page and the pages of its taken seats read-only, reads them (ring_read) and
 * unmaps them again. Never fails: what it cannot read is reported as unknown. */
void ringview_read(const RegRingView *g, RingView *ret);
