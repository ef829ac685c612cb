/* Reading a ring's shared memory written by the other side (proto/ring.h): only checked values
 * leave these functions. Fuzzed (tests/fuzz/fuzz-ring.c). */
#include "ring.h"

#include <stdio.h>
#include <string.h>

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

static const char *mode_name(uint32_t mode)
{
        return mode == RING_BACKPRESSURE ? "backpressure" : mode == RING_LATEST ? "latest"
               : mode == RING_STREAM     ? "stream"
                                         : "unknown";
}

const char *ring_ctl_check(const volatile RingCtl *c, const RingShape *shape, char *why, size_t cap)
{
        /* One load each: the producer may rewrite the page while it is checked, and a value checked
         * must be the value reported. */
        uint32_t magic = c->magic, version = c->version, n_slots = c->n_slots, n_members = c->n_members;
        uint32_t mode = c->mode, head_slot = c->head_slot;
        uint64_t slot_size = c->slot_size;

        if (shape->n_slots < 1 || shape->n_slots > RING_MAX_SLOTS || shape->n_members < 1 ||
            shape->n_members > RING_MAX_MEMBERS)
                snprintf(why, cap, "the ring's shape (%u slots, %u members) is outside the limits (1 to %d slots, "
                         "1 to %d members)", shape->n_slots, shape->n_members, RING_MAX_SLOTS, RING_MAX_MEMBERS);
        else if (magic != RING_MAGIC)
                snprintf(why, cap, "magic is 0x%08x, not a ring's (0x%08x)", magic, RING_MAGIC);
        else if (version != RING_LAYOUT_VERSION)
                snprintf(why, cap, "layout version %u; this release reads version %u", version, RING_LAYOUT_VERSION);
        else if (n_slots != shape->n_slots)
                snprintf(why, cap, "n_slots is %u; the ring was declared with %u", n_slots, shape->n_slots);
        else if (n_members != shape->n_members)
                snprintf(why, cap, "n_members is %u; the ring was declared with %u", n_members, shape->n_members);
        else if (slot_size != shape->slot_size)
                snprintf(why, cap, "slot_size is %llu; the ring was declared with %llu",
                         (unsigned long long)slot_size, (unsigned long long)shape->slot_size);
        else if (mode != shape->mode)
                snprintf(why, cap, "mode is %u (%s); the ring was declared %s", mode, mode_name(mode),
                         mode_name(shape->mode));
        else if (head_slot >= n_slots)
                snprintf(why, cap, "head_slot is %u, past the last of its %u slots", head_slot, n_slots);
        else
                return NULL;
        return why;
}

static uint64_t frames_behind(uint64_t head, uint64_t position)
{
        return position < head ? head - position : 0;
}

/* What a confirmed member page says it took, clamped to the frames published since its start. */
static uint64_t taken_read(const volatile RingMember *m, uint64_t start, uint64_t head)
{
        uint64_t floor = start ? start - 1 : 0, most = frames_behind(head, floor);
        uint64_t taken = __atomic_load_n(&m->taken, __ATOMIC_RELAXED);

        return taken > most ? most : taken;
}

/* Seat i of a validated control page, for membership epoch. */
static RingSeatReading seat_read(const volatile RingCtl *c, uint32_t i, uint64_t epoch, RingMode mode, uint64_t head,
                                 const volatile RingMember *m)
{
        const volatile RingMemberSlot *s = &c->member[i];
        RingSeatReading v = { 0 };
        RingMemberView mv;
        uint64_t start;

        /* The producer stores start, then epoch (release), then state: epoch read with acquire before
         * start gives the start of that membership. */
        if (__atomic_load_n(&s->epoch, __ATOMIC_ACQUIRE) != epoch ||
            __atomic_load_n(&s->state, __ATOMIC_ACQUIRE) != RING_MEMBER_ACTIVE)
                return v;
        start = __atomic_load_n(&s->start, __ATOMIC_RELAXED);
        v.seated = true;
        if (mode == RING_LATEST) {
                uint64_t held = 0;

                /* What the producer compares for equality only is a number to show here: at most head,
                 * and only from a page that speaks for this membership. */
                if (m && __atomic_load_n(&m->epoch, __ATOMIC_ACQUIRE) == epoch) {
                        v.confirmed = true;
                        held = __atomic_load_n(&m->held, __ATOMIC_ACQUIRE);
                        v.taken = taken_read(m, start, head);
                }
                v.position = held > head ? head : held;
                v.lag = v.position ? frames_behind(head, v.position) : 0;
                return v;
        }
        if (m)
                mv = ring_member_view(m, epoch, start, head);
        else
                mv = (RingMemberView){ .released = start ? start - 1 : 0 };
        v.confirmed = mv.valid;
        if (mv.valid)
                v.taken = taken_read(m, start, head);
        /* Above head only when the control page's start is: a producer's garbage, shown as head. */
        v.position = mv.released > head ? head : mv.released;
        v.lag = frames_behind(head, v.position);
        return v;
}

void ring_read(const volatile RingCtl *c, uint32_t n_slots, uint32_t n_members, uint64_t slot_size, RingMode mode,
               const uint64_t *epochs, const volatile RingMember *const *pages, RingReading *ret)
{
        const RingShape shape = { .n_slots = n_slots, .n_members = n_members, .slot_size = slot_size, .mode = mode };

        memset(ret, 0, sizeof(*ret));
        if (ring_ctl_check(c, &shape, ret->why, sizeof(ret->why)))
                return;
        ret->ctl_valid = true;
        ret->head = __atomic_load_n(&c->head, __ATOMIC_ACQUIRE);
        for (uint32_t i = 0; i < n_members; i++)
                if (epochs[i])
                        ret->seat[i] = seat_read(c, i, epochs[i], mode, ret->head, pages[i]);
}
