/* Fuzz target: what a ring's producer (and the broker) read from memory a member writes, and what a
 * member reads from the producer's control page (proto/ring.c).
 *
 * The input is a member page's bytes (as a scribbling member may leave them) followed by what the
 * reader knows: the membership's epoch and start, the ring's head and slot count; then a control
 * page. Every view must come out within what can be true: a page of another membership counts as
 * having released exactly what the member never had; a released value is never above head nor
 * below start - 1; a member lets a frame through exactly when its released count says so (or it
 * joined after the frame to be overwritten); and the same bytes give the same view. A control page
 * is accepted (ring_ctl_check, what a member checks at join) exactly when its layout is the ring's
 * shape, whatever its bytes and whatever shape the broker announced; refused, it says why in a
 * string that fits its buffer.
 *
 * Then what the broker shows operators (ring_read): after the control page, one byte per seat
 * says which membership the broker knows there (none, the control page's, the member page's, or
 * the next 8 bytes) and whether the member page is mapped; every seat the control page does not
 * seat shows nothing, every position is at most head and its lag is exactly what separates it from
 * head (latest: a member holding nothing lags by nothing). */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "fuzz.h"
#include "ring.h"

static uint64_t take_u64(const uint8_t **p, const uint8_t *end)
{
        uint64_t v = 0;

        for (int i = 0; i < 8 && *p < end; i++)
                v |= (uint64_t)*(*p)++ << (8 * i);
        return v;
}

/* What ring_ctl_check must accept: the page's layout is the shape, and the shape within limits. */
static bool ctl_fits(const RingCtl *c, const RingShape *shape)
{
        return shape->n_slots >= 1 && shape->n_slots <= RING_MAX_SLOTS && shape->n_members >= 1 &&
               shape->n_members <= RING_MAX_MEMBERS && c->magic == RING_MAGIC && c->version == RING_LAYOUT_VERSION &&
               c->n_slots == shape->n_slots && c->n_members == shape->n_members && c->slot_size == shape->slot_size &&
               c->mode == shape->mode && c->head_slot < c->n_slots;
}

/* A member's check at join: accepted exactly when the page fits, refused with a reason that fits. */
static void check_ctl_check(const RingCtl *c, const RingShape *shape)
{
        char why[256], small[8];
        const char *r = ring_ctl_check(c, shape, why, sizeof(why));

        memset(small, 0x55, sizeof(small));
        CHECK((r == NULL) == ctl_fits(c, shape));
        CHECK((ring_ctl_check(c, shape, small, sizeof(small)) == NULL) == (r == NULL));
        if (!r)
                return;
        CHECK(r == why);
        CHECK(why[0] && memchr(why, 0, sizeof(why)));
        CHECK(memchr(small, 0, sizeof(small)));
}

/* The operators' view of ctl with the broker's seats taken from the input. */
static void check_ring_read(const RingCtl *ctl, const RingMember *page, const uint8_t *p, const uint8_t *end)
{
        static RingReading got, again;
        const volatile RingMember *pages[RING_MAX_MEMBERS] = { 0 };
        uint64_t epochs[RING_MAX_MEMBERS] = { 0 };
        uint32_t n_members = ctl->n_members <= RING_MAX_MEMBERS ? ctl->n_members : RING_MAX_MEMBERS;
        RingMode mode = p < end ? (RingMode)(*p++ % 3) : RING_BACKPRESSURE;

        for (uint32_t i = 0; i < n_members && p < end; i++) {
                uint8_t sel = *p++;

                switch (sel & 3) {
                case 0: epochs[i] = 0; break;
                case 1: epochs[i] = ctl->member[i].epoch; break;
                case 2: epochs[i] = page->epoch; break;
                default: epochs[i] = take_u64(&p, end); break;
                }
                pages[i] = sel & 4 ? NULL : page;
        }
        ring_read(ctl, ctl->n_slots, ctl->n_members, ctl->slot_size, mode, epochs, pages, &got);
        ring_read(ctl, ctl->n_slots, ctl->n_members, ctl->slot_size, mode, epochs, pages, &again);
        CHECK(memcmp(&got, &again, sizeof(got)) == 0);
        CHECK(got.ctl_valid == ctl_fits(ctl, &(RingShape){ ctl->n_slots, ctl->n_members, ctl->slot_size, mode }));
        for (uint32_t i = 0; i < RING_MAX_MEMBERS; i++) {
                const RingSeatReading *s = &got.seat[i];
                bool seated = got.ctl_valid && i < n_members && epochs[i] && ctl->member[i].epoch == epochs[i] &&
                              ctl->member[i].state == RING_MEMBER_ACTIVE;

                CHECK(s->seated == seated);
                if (!seated) {
                        CHECK(!s->confirmed && s->position == 0 && s->lag == 0);
                        continue;
                }
                CHECK(s->confirmed == (pages[i] && page->epoch == epochs[i]));
                CHECK(s->position <= got.head);
                /* What a member says it took: nothing unconfirmed, never more than it could have. */
                uint64_t floor = ctl->member[i].start ? ctl->member[i].start - 1 : 0;
                uint64_t most = got.head > floor ? got.head - floor : 0;
                CHECK(s->taken == (s->confirmed ? (page->taken < most ? page->taken : most) : 0));
                if (mode == RING_LATEST) {
                        /* Holding nothing is not lagging: its next take gets the newest frame. */
                        CHECK(s->position == (s->confirmed ? (page->held < got.head ? page->held : got.head) : 0));
                        CHECK(s->lag == (s->position ? got.head - s->position : 0));
                } else {
                        CHECK(s->lag == got.head - s->position);
                        RingMemberView v = ring_member_view(pages[i] ? page : &(RingMember){ 0 }, epochs[i],
                                                            ctl->member[i].start, got.head);
                        CHECK(s->position == (v.released < got.head ? v.released : got.head));
                }
        }
        if (!got.ctl_valid)
                CHECK(got.head == 0);
        else
                CHECK(got.head == ctl->head);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        static RingMember page; /* static: aligned as the real page is */
        static RingCtl ctl;
        const uint8_t *p = data, *end = data + size;
        uint64_t epoch, start, head, frame;
        uint32_t n_slots;
        RingMemberView v, again;
        size_t n;

        memset(&page, 0, sizeof(page));
        n = size < sizeof(page) ? size : sizeof(page);
        memcpy(&page, p, n);
        p += n;
        epoch = take_u64(&p, end);
        start = take_u64(&p, end);
        head = take_u64(&p, end);
        frame = take_u64(&p, end);
        n_slots = 1 + (uint32_t)(take_u64(&p, end) % RING_MAX_SLOTS);

        v = ring_member_view(&page, epoch, start, head);
        again = ring_member_view(&page, epoch, start, head);
        CHECK(v.valid == again.valid && v.released == again.released && v.held == again.held &&
              v.sleeping == again.sleeping);
        CHECK(v.valid == (page.epoch == epoch && epoch != 0));
        if (!v.valid) {
                CHECK(v.released == (start ? start - 1 : 0));
                CHECK(v.held == 0 && !v.sleeping);
        } else {
                uint64_t floor = start ? start - 1 : 0;

                /* Clamped, in this order: to head, then up to start - 1 (a start beyond head is the
                 * producer's own affair: it never sets one). */
                if (floor <= head)
                        CHECK(v.released >= floor && v.released <= head);
                CHECK(v.held == page.held);
                CHECK(v.sleeping == (page.sleeping != 0));
        }
        if (ring_member_lets(&v, start, frame, n_slots))
                CHECK(frame <= n_slots || frame - n_slots < start || v.released >= frame - n_slots);
        else
                CHECK(frame > n_slots && frame - n_slots >= start && v.released < frame - n_slots);

        /* A control page from the rest of the input. */
        memset(&ctl, 0, sizeof(ctl));
        n = (size_t)(end - p) < sizeof(ctl) ? (size_t)(end - p) : sizeof(ctl);
        memcpy(&ctl, p, n);
        p += n;
        /* Against the shape it claims for itself, the same with one slot more or another mode, and a
         * shape made of the reader's numbers above. */
        {
                const RingShape own = { ctl.n_slots, ctl.n_members, ctl.slot_size, (RingMode)ctl.mode };
                RingShape other = own;

                check_ctl_check(&ctl, &own);
                other.n_slots++;
                check_ctl_check(&ctl, &other);
                CHECK(ring_ctl_check(&ctl, &other, (char[64]){ 0 }, 64) != NULL);
                other = own;
                other.mode = (RingMode)((own.mode + 1) % 3);
                check_ctl_check(&ctl, &other);
                other = (RingShape){ n_slots, (uint32_t)(start % (RING_MAX_MEMBERS + 2)), head, (RingMode)(frame % 4) };
                check_ctl_check(&ctl, &other);
        }
        check_ring_read(&ctl, &page, p, end);
        return 0;
}
