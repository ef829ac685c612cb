/* Rings in the registry: the broker sets them up, accounts for them and cleans up after them; it is
 * never on the per-frame path (docs/design.md "Rings").
 *
 * A producer declares a ring (ring-create), then registers its parts one fd at a time (ring-part):
 * the control page, the slots and one member page per seat, all ordinary buffers of the producer
 * except that they are attachable only by the ring's members (a member page only by the member in
 * its seat) and never by name. A consumer joins (ring-join): it gets a seat and a new epoch, the
 * producer is told (member-joined), and the consumer attaches the parts it needs by id. Leaving,
 * dying or being evicted by the producer (its lease) frees the seat and tells both sides
 * (member-left). The producer's death revokes the parts as for any buffer.
 *
 * After a broker restart the producer declares its ring again (restored) with the seats it still
 * counts as seated; their members come back and ask for their seat by index and epoch (rejoin),
 * in either order; seats nobody comes back for within the restart grace are freed (at once when
 * the ring comes back after it), members whose ring does not come back are told. Frames never
 * stopped meanwhile: they do not need the broker.
 *
 * What this file must never do: let a peer other than a seat's member attach that seat's page
 * (the page is the member's only say in the ring, and the producer trusts nothing else it reads).
 *
 * Layer: calls claims (a part refuses claims for its id) and the core; waits, peers and views call
 * in. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "ring.h"
#include "registry-claims.h"
#include "registry-core.h"
#include "registry-rings-core.h"

static RegRing *ring_lookup(const Registry *r, const char *name)
{
        return HMAP_FIND(&r->rings, hash_str(name), RegRing, node, g, strcmp(g->name, name) == 0);
}

RegRing *registry_ring_by_name(const Registry *r, const char *name)
{
        return ring_lookup(r, name);
}

/* The ring a producer's request names: p's own (0, *ret), or a code with why (there is none, or it is
 * another producer's). */
static int own_ring(const Registry *r, const RegPeer *p, const char *ring, RegRing **ret, RegWhy *why)
{
        RegRing *g = ring_lookup(r, ring);

        if (!g)
                return reg_fail(why, (RegWhy){ REG_E_NO_RING, .no_ring = { ring } });
        if (g->owner != p)
                return reg_fail(why, (RegWhy){ REG_E_RING_OTHERS, .ring_others = { ring } });
        *ret = g;
        return 0;
}

/* A ring event: name, seat, epoch and an optional reason. */
static void ring_event(Registry *r, RegPeer *to, ProtoEvent ev, const RegRing *g, const RingSeat *s, RegWhy why,
                       RegSink *o)
{
        reg_emit(o, &(RegChange){ .type = REG_CH_RING_EVENT, .to = to, .event = ev, .str = g->name,
                                  .index = s->index, .epoch = s->epoch, .why = why });
        r->counters.events++;
}

/* The parts a seat's member may write: its page, and a stream ring's counters. */
static uint32_t seat_page(const RegRing *g, uint32_t seat)
{
        return 1 + g->n_slots + seat;
}

static bool seat_has_parts(const RegRing *g, uint32_t seat)
{
        return g->parts[seat_page(g, seat)] &&
               (g->mode != PROTO_MODE_STREAM || g->parts[seat_page(g, seat) + g->n_members]);
}

/* A membership ended: the member keeps whatever it mapped of its page and counters, so they are no
 * longer the seat's. Its next member gets new ones, which the producer registers when it hears
 * member-left; until then the seat is not handed out. Without this, a peer that left (or was
 * evicted) could still write the next member's page and speak for it. The old parts stay buffers
 * of the producer, attachable by nobody, until it frees them. */
static void seat_parts_let_go(RegRing *g, uint32_t seat)
{
        uint32_t page = seat_page(g, seat);

        if (g->parts[page])
                reg_ring_part_gone(g->parts[page]);
        if (g->mode == PROTO_MODE_STREAM && g->parts[page + g->n_members])
                reg_ring_part_gone(g->parts[page + g->n_members]);
}

/* Empties a seat, telling the producer (and the member, unless it is the one leaving or gone). A
 * reserved seat (its member has not come back) is freed with a word to the producer only. Either
 * way the seat's parts are let go of. */
static void seat_free(Registry *r, RingSeat *s, RegWhy why, bool tell_member, RegSink *o)
{
        RegPeer *member = s->peer;

        if (s->reserved) {
                s->reserved = false;
                seat_parts_let_go(s->ring, s->index);
                if (s->ring->owner)
                        ring_event(r, s->ring->owner, PROTO_EV_MEMBER_LEFT, s->ring, s, why, o);
                return;
        }
        if (!member)
                return;
        s->peer = NULL;
        list_unlink(&s->peer_link);
        r->n_seated--;
        seat_parts_let_go(s->ring, s->index);
        if (s->ring->owner)
                ring_event(r, s->ring->owner, PROTO_EV_MEMBER_LEFT, s->ring, s, why, o);
        if (tell_member)
                ring_event(r, member, PROTO_EV_MEMBER_LEFT, s->ring, s, why, o);
}

/* Forgets a ring: its seats empty, its parts stay buffers of the producer but nobody may attach
 * them any more (the producer frees them, or its death revokes them). */
static void ring_destroy(Registry *r, RegRing *g, RegWhy why, RegSink *o)
{
        g->owner = NULL; /* members hear it; the producer asked, or is gone */
        for (uint32_t i = 0; i < g->n_members; i++)
                seat_free(r, &g->seats[i], why, true, o);
        for (uint32_t i = 0; i < ring_n_parts(g); i++)
                if (g->parts[i])
                        g->parts[i]->ring = NULL;
        list_unlink(&g->owner_link);
        list_unlink(&g->link);
        hmap_remove(&r->rings, &g->node);
        reg_uncharge(r, g->acct->uid, g->cost);
        g->acct->buffers--;
        reg_acct_put(r, g->acct);
        r->n_rings--;
        free(g->device);
        free(g->parts);
        free(g->seats);
        free(g);
}

int reg_ring_attach_check(const RegBuffer *b, const RegPeer *p, RegWhy *why)
{
        const RegRing *g = b->ring;
        uint32_t first_page;

        if (!b->ring_part)
                return 0;
        if (!g)
                return reg_fail(why, (RegWhy){ REG_E_PART_OF_NO_RING, .part_of_no_ring = { b->id, b->name } });
        first_page = 1 + g->n_slots;
        for (uint32_t i = 0; i < g->n_members; i++) {
                if (g->seats[i].peer != p)
                        continue;
                /* The control page and the slots are every member's; a member page (and counter) its
                 * seat's only. */
                if (b->ring_index < first_page || b->ring_index == first_page + i ||
                    b->ring_index == first_page + g->n_members + i)
                        return 0;
        }
        return reg_fail(why, (RegWhy){ REG_E_RING_MEMBERS_ONLY, .ring_members_only = { b->id, b->name, g->name } });
}

static void seat_claims_settle(Registry *r, RegRing *g, RegSink *o);

/* Frees the seats of g still waiting for their members: the restart grace is over (the producer
 * hears member-left for each). */
static void seats_unreserve(Registry *r, RegRing *g, RegSink *o)
{
        const RegWhy why = { REG_R_MEMBER_GRACE_OVER, .member_grace_over = { .grace_ms = r->restart_grace_ms } };

        for (uint32_t i = 0; i < g->n_members; i++)
                if (g->seats[i].reserved)
                        seat_free(r, &g->seats[i], why, false, o);
}

int registry_ring_create(Registry *r, RegPeer *p, const RegRingSpec *s, RegWhy *why, RegSink *out)
{
        size_t len = strlen(s->name);
        uint32_t n_parts = 1 + s->n_slots + s->n_members * (s->mode == PROTO_MODE_STREAM ? 2 : 1);
        uint64_t cost = budget_alloc_cost(sizeof(RegRing) + len + 1) +
                        budget_alloc_cost(n_parts * sizeof(RegBuffer *)) +
                        budget_alloc_cost(s->n_members * sizeof(RingSeat)) + REG_INDEX_COST +
                        (s->device && *s->device ? budget_alloc_cost(strlen(s->device) + 1) : 0) +
                        (uint64_t)s->n_members * REG_FRAME_COST;
        RegRing *g;
        int e;

        if (ring_lookup(r, s->name))
                return reg_fail(why, (RegWhy){ REG_E_RING_EXISTS, .ring_exists = { s->name } });
        if (p->acct->buffers >= r->limits.buffers_per_uid)
                return reg_fail(why, (RegWhy){ REG_E_RING_BUFFERS_LIMIT,
                                               .ring_buffers_limit = { p->creds.uid, p->acct->buffers } });
        e = reg_charge(r, p->creds.uid, cost, why);
        if (e != 0)
                return e;
        g = calloc(1, sizeof(*g) + len + 1);
        if (!g)
                goto no_memory;
        g->cost = cost;
        memcpy(g->name, s->name, len + 1);
        g->owner = p;
        g->acct = p->acct;
        g->kind = s->kind;
        g->slot_size = s->slot_size;
        g->n_slots = s->n_slots;
        g->n_members = s->n_members;
        g->mode = s->mode;
        g->lease_ms = s->lease_ms;
        g->parts = calloc(ring_n_parts(g), sizeof(*g->parts)); /* after the mode: it decides how many */
        g->seats = calloc(s->n_members, sizeof(*g->seats));
        g->device = s->device && *s->device ? strdup(s->device) : NULL;
        if (!g->parts || !g->seats || (s->device && *s->device && !g->device) ||
            hmap_insert(&r->rings, &g->node, hash_str(g->name)) < 0)
                goto no_memory;
        for (uint32_t i = 0; i < g->n_members; i++) {
                g->seats[i].ring = g;
                g->seats[i].index = i;
                list_init(&g->seats[i].peer_link);
                if (s->restored && s->epochs && s->epochs[i]) {
                        g->seats[i].epoch = s->epochs[i];
                        g->seats[i].reserved = true;
                }
        }
        g->next_epoch = s->restored ? s->next_epoch : 0;
        list_append(&p->rings, &g->owner_link);
        g->seq = ++r->next_ring_seq;
        list_append(&r->ring_list, &g->link);
        g->acct->buffers++;
        r->n_rings++;
        reg_done(out, p);
        if (s->restored)
                seat_claims_settle(r, g, out);
        /* Declared after the grace (its producer came back late, or only its connection dropped): no
         * member can still be coming back, and a seat reserved now would stay taken for good. */
        if (s->restored && !r->in_grace)
                seats_unreserve(r, g, out);
        return 0;

no_memory:
        if (g) {
                free(g->parts);
                free(g->seats);
                free(g->device);
        }
        free(g);
        reg_uncharge(r, p->creds.uid, cost);
        return -ENOMEM;
}

/* What part `index` of ring g must be: its kind, size and whether members may write it. 0, or the
 * rule (a RegPartRule) the publish breaks. */
static RegPartRule part_mismatch(const RegRing *g, uint32_t index, const RegPublish *a)
{
        const ProtoBufferInfo *m = &a->info;
        bool slot = index >= 1 && index <= g->n_slots;

        if (index >= ring_n_parts(g))
                return REG_PART_PART_BEYOND;
        if (g->parts[index])
                return REG_PART_PART_TAKEN;
        if (m->broker_held || a->retire_after)
                return REG_PART_PART_HELD_OR_RETIRED;
        if (slot) {
                if (m->kind != g->kind || m->size != g->slot_size)
                        return REG_PART_SLOT_SHAPE;
                if (m->writable)
                        return REG_PART_SLOT_READ_ONLY;
                if (g->device && (!a->device || strcmp(a->device, g->device) != 0))
                        return REG_PART_SLOT_DEVICE;
                return 0;
        }
        if (index > g->n_slots + g->n_members) {
                if (m->kind != PROTO_KIND_CUDA_VMM || !m->writable || m->size < 128 || m->size > (64u << 20))
                        return REG_PART_COUNTERS_SHAPE;
                if (g->device && (!a->device || strcmp(a->device, g->device) != 0))
                        return REG_PART_COUNTERS_DEVICE;
                return 0;
        }
        if (m->kind != PROTO_KIND_MEMFD || m->size != RING_PAGE)
                return REG_PART_PAGE_SHAPE;
        if (index == 0 && m->writable)
                return REG_PART_CONTROL_READ_ONLY;
        if (index > g->n_slots && !m->writable)
                return REG_PART_PAGE_WRITABLE;
        return 0;
}

int registry_ring_part(Registry *r, RegPeer *p, const char *ring, uint32_t index, RegPublish *a, RegWhy *why,
                       RegSink *out)
{
        _cleanup_close_ int fd = steal_fd(a->fd);
        char name[PROTO_MAX_NAME + 1];
        RegPartRule rule;
        RegBuffer *b;
        RegRing *g;
        int e;

        e = own_ring(r, p, ring, &g, why);
        if (e != 0)
                return e;
        rule = part_mismatch(g, index, a);
        if (!rule && a->restored && (a->generation == 0 || a->generation > r->generation))
                rule = REG_PART_RESTORED_GENERATION;
        if (rule)
                return reg_fail(why, (RegWhy){ REG_E_PART_MISFIT, .part_misfit = { ring, index, rule } });
        /* A part is new memory under an id nobody holds: registering it must not adopt an orphan of
         * this producer that has the id (as a restored publish would), or the reply would speak for
         * a buffer that is no part of the ring. */
        b = a->buffer ? reg_buffer_lookup(r, a->buffer) : NULL;
        if (b)
                return reg_fail(why, (RegWhy){ REG_E_PART_KEY_TAKEN,
                                               .part_key_taken = { a->buffer, .owner = { .peer = b->owner_id,
                                                                                         .uid = b->owner_uid } } });
        ring_part_name(name, sizeof(name), ring, index, g->n_slots, g->n_members);
        a->name = name;
        e = reg_buffer_register(r, p, a, &fd, &b, why);
        if (e != 0)
                return e;
        b->ring_part = true;
        b->ring = g;
        b->ring_index = index;
        g->parts[index] = b;
        g->n_registered++;
        g->set_up |= g->n_registered == ring_n_parts(g);
        /* Live, but under no name: members attach it by id. A restored part keeps its generation. */
        reg_buffer_set_state(r, b, PROTO_STATE_LIVE);
        if (!a->restored)
                b->generation = ++r->generation;
        reg_succeed(out, reg_asker(p), (RegChange){ .reply = REG_RE_PART, .buffer = b });
        /* Reclaims waiting for this id are refused now (a part is taken back by joining the ring),
         * not left to count against their peers' references until the grace ends. */
        reg_claims_adopt(r, b, out);
        return 0;
}

bool reg_ring_set_up(const RegRing *g)
{
        if (!g->set_up)
                return false;
        for (uint32_t i = 0; i <= g->n_slots; i++) /* the control page and the slots: every member's */
                if (!g->parts[i])
                        return false;
        return true;
}

/* The parts a member of seat i attaches: the control page, the slots, its own page (and counters).
 * Their number. */
static uint32_t seat_parts(const RegRing *g, uint32_t seat, RegPartRef *parts)
{
        uint32_t page = 1 + g->n_slots + seat, counter = page + g->n_members;
        uint32_t n = g->n_slots + (g->mode == PROTO_MODE_STREAM ? 3 : 2);

        for (uint32_t i = 0; i < n; i++) {
                uint32_t part = i <= g->n_slots ? i : i == g->n_slots + 1 ? page : counter;

                parts[i] = (RegPartRef){ part, g->parts[part]->id };
        }
        return n;
}

int registry_ring_join(Registry *r, RegPeer *p, const char *ring, RegWhy *why, RegSink *out)
{
        RegRing *g = ring_lookup(r, ring);
        RegPartRef parts[RING_MAX_SLOTS + 3];
        RingSeat *s = NULL;
        bool renewing = false;
        uint32_t n_parts;

        if (!g)
                return reg_fail(why, (RegWhy){ REG_E_NO_RING, .no_ring = { ring } });
        if (!reg_ring_set_up(g))
                return reg_fail(why, (RegWhy){ REG_E_RING_SETTING_UP,
                                               .ring_setting_up = { ring, g->n_registered, ring_n_parts(g) } });
        for (uint32_t i = 0; i < g->n_members; i++) {
                if (g->seats[i].peer == p)
                        return reg_fail(why, (RegWhy){ REG_E_RING_MEMBER, .ring_member = { ring, i } });
                if (s || g->seats[i].peer || g->seats[i].reserved)
                        continue;
                if (seat_has_parts(g, i))
                        s = &g->seats[i];
                else
                        renewing = true;
        }
        /* A free seat without parts gets them at the producer's next ring call: worth a retry
         * (NOT_FOUND is what a joining client waits out), unlike a ring that is full. */
        if (!s && renewing)
                return reg_fail(why, (RegWhy){ REG_E_RING_NO_SEAT_READY, .ring_no_seat_ready = { ring } });
        if (!s)
                return reg_fail(why, (RegWhy){ REG_E_RING_FULL, .ring_full = { ring, g->n_members } });
        n_parts = seat_parts(g, s->index, parts);
        s->peer = p;
        s->epoch = ++g->next_epoch;
        list_append(&p->seats, &s->peer_link);
        r->n_seated++;
        reg_succeed(out, reg_asker(p), (RegChange){ .reply = REG_RE_SEAT, .ring = g, .index = s->index,
                                                    .epoch = s->epoch, .parts = parts, .n = n_parts });
        ring_event(r, g->owner, PROTO_EV_MEMBER_JOINED, g, s, (RegWhy){ REG_WHY_NONE }, out);
        return 0;
}

static RingSeat *seat_of(RegRing *g, const RegPeer *p)
{
        for (uint32_t i = 0; g && i < g->n_members; i++)
                if (g->seats[i].peer == p)
                        return &g->seats[i];
        return NULL;
}

/* Gives member p back its seat (index, epoch) of ring g. 0, or a code (with why filled in). */
static int seat_bind(Registry *r, RegRing *g, RegPeer *p, uint32_t index, uint64_t epoch, RegWhy *why)
{
        RingSeat *s = seat_of(g, p);

        /* As for a join: one seat per connection, whatever epochs it can name. */
        if (s)
                return reg_fail(why, (RegWhy){ REG_E_RING_MEMBER, .ring_member = { g->name, s->index } });
        if (index >= g->n_members)
                return reg_fail(why, (RegWhy){ REG_E_RING_SEATS, .ring_seats = { g->name, g->n_members } });
        s = &g->seats[index];
        if (!s->reserved || s->epoch != epoch)
                return reg_fail(why, (RegWhy){ REG_E_SEAT_NOT_WAITING, .seat_not_waiting = { g->name, index, epoch } });
        s->reserved = false;
        s->peer = p;
        list_append(&p->seats, &s->peer_link);
        r->n_seated++;
        return 0;
}

static void seat_claim_free(Registry *r, SeatClaim *c)
{
        list_unlink(&c->link);
        list_unlink(&c->peer_link);
        c->peer->n_seat_claims--;
        r->n_seat_claims--;
        reg_uncharge(r, c->peer->creds.uid, c->cost);
        free(c);
}

/* The member-left a member gets when its seat cannot come back. */
static void seat_claim_refuse(Registry *r, SeatClaim *c, RegWhy why, RegSink *o)
{
        reg_emit(o, &(RegChange){ .type = REG_CH_RING_EVENT, .to = c->peer, .event = PROTO_EV_MEMBER_LEFT,
                                  .str = c->ring, .index = c->index, .epoch = c->epoch, .why = why });
        r->counters.events++;
        seat_claim_free(r, c);
}

/* A restored ring takes over the members that asked for their seats before it came back. */
static void seat_claims_settle(Registry *r, RegRing *g, RegSink *o)
{
        RegWhy why;

        list_for_each_safe(pos, &r->seat_claims) {
                SeatClaim *c = list_entry(pos, SeatClaim, link);

                if (strcmp(c->ring, g->name) != 0)
                        continue;
                if (seat_bind(r, g, c->peer, c->index, c->epoch, &why))
                        seat_claim_refuse(r, c, why, o);
                else
                        seat_claim_free(r, c);
        }
}

int registry_ring_rejoin(Registry *r, RegPeer *p, const char *ring, uint32_t index, uint64_t epoch, RegWhy *why,
                         RegSink *out)
{
        RegRing *g = ring_lookup(r, ring);
        size_t len = strlen(ring);
        uint64_t cost;
        SeatClaim *c;
        int e;

        if (g) {
                e = seat_bind(r, g, p, index, epoch, why);
                if (e == 0)
                        reg_done(out, p);
                return e;
        }
        if (!r->in_grace)
                return reg_fail(why, (RegWhy){ REG_E_RING_GONE, .ring_gone = { ring } });
        /* Bounded per connection like its other waits, so that one peer cannot take every claim. */
        if (p->n_seat_claims >= r->limits.waits_per_peer)
                return reg_fail(why, (RegWhy){ REG_E_SEAT_CLAIMS_LIMIT, .seat_claims_limit = { p->n_seat_claims } });
        cost = budget_alloc_cost(sizeof(*c) + len + 1) + REG_FRAME_COST;
        e = reg_charge(r, p->creds.uid, cost, why);
        if (e != 0)
                return e;
        c = calloc(1, sizeof(*c) + len + 1);
        if (!c) {
                reg_uncharge(r, p->creds.uid, cost);
                return -ENOMEM;
        }
        c->cost = (uint32_t)cost;
        c->peer = p;
        c->index = index;
        c->epoch = epoch;
        memcpy(c->ring, ring, len + 1);
        list_append(&r->seat_claims, &c->link);
        list_append(&p->seat_claims, &c->peer_link);
        p->n_seat_claims++;
        r->n_seat_claims++;
        reg_succeed(out, reg_asker(p), (RegChange){ .reply = REG_RE_PENDING });
        return 0;
}

void reg_rings_grace_end(Registry *r, RegSink *o)
{
        const RegWhy why = { REG_R_RING_GRACE_OVER, .ring_grace_over = { .grace_ms = r->restart_grace_ms } };
        RegPeer *p;

        while (!list_empty(&r->seat_claims))
                seat_claim_refuse(r, list_entry(r->seat_claims.next, SeatClaim, link), why, o);
        for (p = registry_peer_first(r); p; p = registry_peer_next(r, p))
                list_for_each(pos, &p->rings)
                        seats_unreserve(r, list_entry(pos, RegRing, owner_link), o);
}

/* Drops p's references on g's parts (an evicted member may not come back for them). */
static void drop_part_holds(Registry *r, RegRing *g, RegPeer *p, RegSink *o)
{
        list_for_each_safe(pos, &p->holds) {
                Hold *h = list_entry(pos, Hold, peer_link);
                RegBuffer *b = h->buf;

                if (b->ring != g)
                        continue;
                reg_hold_drop(r, h);
                reg_buffer_drain_if_done(r, b, (RegWhy){ REG_WHY_NONE }, o);
        }
}

int registry_ring_leave(Registry *r, RegPeer *p, const char *ring, RegWhy *why, RegSink *out)
{
        RingSeat *s = seat_of(ring_lookup(r, ring), p);

        if (!s)
                return reg_fail(why, (RegWhy){ REG_E_NOT_MEMBER, .not_member = { ring } });
        reg_done(out, p);
        seat_free(r, s, (RegWhy){ REG_R_MEMBER_LEFT }, false, out);
        return 0;
}

int registry_ring_evict(Registry *r, RegPeer *p, const char *ring, uint32_t index, uint64_t epoch, RegWhy *why,
                        RegSink *out)
{
        RegPeer *member;
        RingSeat *s;
        RegRing *g;
        int e;

        e = own_ring(r, p, ring, &g, why);
        if (e != 0)
                return e;
        reg_done(out, p);
        if (index >= g->n_members || g->seats[index].epoch != epoch ||
            (!g->seats[index].peer && !g->seats[index].reserved))
                return 0; /* it left meanwhile (its member-left event is on its way): nothing to do */
        s = &g->seats[index];
        if (s->reserved) {
                /* Restored, and its member has not come back: the producer gives the seat up, so
                 * that a new member may take it (the producer hears member-left, as for any seat). */
                seat_free(r, s, (RegWhy){ REG_R_EVICTED_UNRETURNED }, false, out);
                return 0;
        }
        member = s->peer;
        /* Before the seat is freed: its page and counters are still the ring's then. */
        drop_part_holds(r, g, member, out);
        seat_free(r, s, (RegWhy){ REG_R_EVICTED_LEASE, .evicted_lease = { g->lease_ms } }, true, out);
        return 0;
}

int registry_ring_close(Registry *r, RegPeer *p, const char *ring, RegWhy *why, RegSink *out)
{
        RegRing *g;
        int e = own_ring(r, p, ring, &g, why);

        if (e != 0)
                return e;
        reg_done(out, p);
        ring_destroy(r, g, (RegWhy){ REG_R_RING_CLOSED }, out);
        return 0;
}

void reg_rings_drop_peer(Registry *r, RegPeer *p, RegSink *o)
{
        const RegWhy why = { REG_R_RING_PRODUCER_GONE,
                             .ring_producer_gone = { .producer = { .peer = p->id, .pid = p->creds.pid,
                                                                   .uid = p->creds.uid } } };

        while (!list_empty(&p->seat_claims))
                seat_claim_free(r, list_entry(p->seat_claims.next, SeatClaim, peer_link));

        while (!list_empty(&p->seats))
                seat_free(r, list_entry(p->seats.next, RingSeat, peer_link), (RegWhy){ REG_R_MEMBER_GONE }, false, o);
        while (!list_empty(&p->rings))
                ring_destroy(r, list_entry(p->rings.next, RegRing, owner_link), why, o);
}

void registry_ring_note_taken(Registry *r, RegRing *g, uint32_t i, uint64_t epoch, uint64_t taken)
{
        RingSeat *s;

        if (i >= g->n_members || !epoch || g->seats[i].epoch != epoch)
                return;
        s = &g->seats[i];
        /* A new membership starts from 0 on its page (the member clears it at join). */
        if (s->taken_epoch != epoch) {
                s->taken_epoch = epoch;
                s->taken_seen = 0;
        }
        if (taken <= s->taken_seen)
                return;
        r->counters.ring_frames_taken += taken - s->taken_seen;
        s->taken_seen = taken;
}
