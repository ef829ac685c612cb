/* Reading a ring's shared memory written by the other side (proto/ring.h): only checked values
 * leave these functions. Fuzzed (tests/fuzz/fuzz-ring.c). */
#include "ring.h"

#include <stdio.h>

RingMemberView ring_member_view(const volatile RingMember *m, uint64_t epoch, uint64_t start, uint64_t head)
{
        RingMemberView v = { 0 };
        uint64_t floor = start ? start - 1 : 0;

        /* Each field is read once: the member may change it between two reads, and a value used
         * twice must be the same value both times. */
        v.valid = __atomic_load_n(&m->epoch, __ATOMIC_ACQUIRE) == epoch && epoch != 0;
        v.released = floor;
        if (!v.valid)
                return v;
        v.released = __atomic_load_n(&m->released, __ATOMIC_ACQUIRE);
        /* A member cannot have released what was not published, nor less than it never had. Above
         * head it only fools the producer into overwriting frames this member still reads (its own
         * loss); below start it could stall everyone, so it counts as start - 1. */
        if (v.released > head)
                v.released = head;
        if (v.released < floor)
                v.released = floor;
        v.held = __atomic_load_n(&m->held, __ATOMIC_ACQUIRE);
        v.sleeping = __atomic_load_n(&m->sleeping, __ATOMIC_ACQUIRE) != 0;
        return v;
}

bool ring_member_lets(const RingMemberView *v, uint64_t start, uint64_t frame, uint32_t n_slots)
{
        /* Frame `frame` goes where frame - n_slots was: that one must be released, unless this member
         * joined after it (it never had it). */
        if (frame <= n_slots)
                return true;
        if (frame - n_slots < start)
                return true;
        return v->released >= frame - n_slots;
}

void ring_part_name(char *buf, size_t cap, const char *ring, uint32_t index, uint32_t n_slots, uint32_t n_members)
{
        if (index == 0)
                snprintf(buf, cap, "%s@ctl", ring);
        else if (index <= n_slots)
                snprintf(buf, cap, "%s@slot.%u", ring, index - 1);
        else if (index <= n_slots + n_members)
                snprintf(buf, cap, "%s@member.%u", ring, index - 1 - n_slots);
        else
                snprintf(buf, cap, "%s@counter.%u", ring, index - 1 - n_slots - n_members);
}

bool ring_ctl_valid(const volatile RingCtl *c, uint32_t n_slots, uint32_t n_members, uint64_t slot_size)
{
        return c->magic == RING_MAGIC && c->version == RING_LAYOUT_VERSION && c->n_slots == n_slots &&
               c->n_members == n_members && c->slot_size == slot_size && n_slots >= 1 &&
               n_slots <= RING_MAX_SLOTS && n_members >= 1 && n_members <= RING_MAX_MEMBERS &&
               (c->mode == RING_BACKPRESSURE || c->mode == RING_LATEST || c->mode == RING_STREAM);
}
