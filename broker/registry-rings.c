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
 * (the page is the member's only say in the ring, and the producer trusts nothing else it reads). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "ring.h"
#include "registry-internal.h"

static RegRing *ring_lookup(const Registry *r, const char *name)
{
        return HMAP_FIND(&r->rings, hash_str(name), RegRing, node, g, strcmp(g->name, name) == 0);
}

RegRing *registry_ring_by_name(const Registry *r, const char *name)
{
        return ring_lookup(r, name);
}

/* A ring event: name, seat, epoch and an optional reason. */
static void ring_event(Registry *r, RegPeer *to, ProtoEvent ev, const RegRing *g, const RingSeat *s,
                       const char *reason, Outbox *o)
{
        ProtoMsg m;

        proto_event_init(&m, ev);
        proto_set_name(&m, proto_str(g->name));
        proto_set_index(&m, s->index);
        proto_set_generation(&m, s->epoch);
        if (reason)
                proto_set_reason(&m, proto_str(reason));
        outbox_send(o, to, &m, -1);
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
static void seat_free(Registry *r, RingSeat *s, const char *why, bool tell_member, Outbox *o)
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
static void ring_destroy(Registry *r, RegRing *g, const char *why, Outbox *o)
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
        g->acct->buffers--;
        reg_acct_put(r, g->acct);
        r->n_rings--;
        free(g->device);
        free(g->parts);
        free(g->seats);
        free(g);
}

void reg_ring_part_gone(RegBuffer *b)
{
        if (b->ring) {
                b->ring->parts[b->ring_index] = NULL;
                b->ring->n_registered--;
                b->ring = NULL;
        }
}

bool reg_ring_may_attach(const RegBuffer *b, const RegPeer *p, char *why, size_t cap)
{
        const RegRing *g = b->ring;
        uint32_t first_page;

        if (!b->ring_part)
                return true;
        if (!g) {
                snprintf(why, cap, "buffer %llu ('%s') belongs to a ring that is closed, or to a membership that "
                         "ended", (unsigned long long)b->id, b->name);
                return false;
        }
        first_page = 1 + g->n_slots;
        for (uint32_t i = 0; i < g->n_members; i++) {
                if (g->seats[i].peer != p)
                        continue;
                /* The control page and the slots are every member's; a member page (and counter) its
                 * seat's only. */
                if (b->ring_index < first_page || b->ring_index == first_page + i ||
                    b->ring_index == first_page + g->n_members + i)
                        return true;
        }
        snprintf(why, cap, "buffer %llu ('%s') is part of ring '%s': only its members may attach it (and a member "
                 "page only its own member); join the ring", (unsigned long long)b->id, b->name, g->name);
        return false;
}

static void seat_claims_settle(Registry *r, RegRing *g, Outbox *o);

/* Frees the seats of g still waiting for their members: the restart grace is over (the producer
 * hears member-left for each). */
static void seats_unreserve(Registry *r, RegRing *g, Outbox *o)
{
        char why[PROTO_MAX_TEXT + 1];

        snprintf(why, sizeof(why), "the member did not come back within the broker's restart grace (%u ms)",
                 r->restart_grace_ms);
        for (uint32_t i = 0; i < g->n_members; i++)
                if (g->seats[i].reserved)
                        seat_free(r, &g->seats[i], why, false, o);
}

void registry_ring_create(Registry *r, RegPeer *p, uint64_t id, const RegRingSpec *s, Outbox *out)
{
        size_t len = strlen(s->name);
        RegRing *g;

        if (ring_lookup(r, s->name)) {
                reg_reply_err(out, p, id, PROTO_STATUS_NAME_TAKEN, "a ring named '%s' exists already", s->name);
                return;
        }
        if (p->acct->buffers >= r->limits.buffers_per_uid) {
                reg_reply_err(out, p, id, PROTO_STATUS_QUOTA, "uid %u owns %u buffers (the limit; a ring counts as "
                              "one, and each of its parts as one)", p->creds.uid, p->acct->buffers);
                return;
        }
        g = calloc(1, sizeof(*g) + len + 1);
        if (!g)
                goto no_memory;
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
        reg_reply_ok(out, p, id);
        if (s->restored)
                seat_claims_settle(r, g, out);
        /* Declared after the grace (its producer came back late, or only its connection dropped): no
         * member can still be coming back, and a seat reserved now would stay taken for good. */
        if (s->restored && !r->in_grace)
                seats_unreserve(r, g, out);
        return;

no_memory:
        if (g) {
                free(g->parts);
                free(g->seats);
                free(g->device);
        }
        free(g);
        registry_peer_mark_lost(p);
}

/* What part `index` of ring g must be: its kind, size and whether members may write it. NULL, or why
 * the publish does not fit. */
static const char *part_mismatch(const RegRing *g, uint32_t index, const RegPublish *a)
{
        const ProtoBufferInfo *m = &a->info;
        bool slot = index >= 1 && index <= g->n_slots;

        if (index >= ring_n_parts(g))
                return "the part index is beyond the ring's parts (1 control page, its slots, one page per "
                       "member, and a stream ring's counters per member)";
        if (g->parts[index])
                return "that part is registered already";
        if (m->broker_held || a->retire_after)
                return "ring parts are neither broker-held nor retired after attaches";
        if (slot) {
                if (m->kind != g->kind || m->size != g->slot_size)
                        return "a slot has the ring's kind and slot size";
                if (m->writable)
                        return "slots are read-only for members";
                if (g->device && (!a->device || strcmp(a->device, g->device) != 0))
                        return "a slot lives on the ring's device";
                return NULL;
        }
        if (index > g->n_slots + g->n_members) {
                if (m->kind != PROTO_KIND_CUDA_VMM || !m->writable || m->size < 128 || m->size > (64u << 20))
                        return "a seat's counters are a writable cuda-vmm buffer of 128 bytes to 64 MiB";
                if (g->device && (!a->device || strcmp(a->device, g->device) != 0))
                        return "a seat's counters live on the ring's device";
                return NULL;
        }
        if (m->kind != PROTO_KIND_MEMFD || m->size != RING_PAGE)
                return "the control page and member pages are memfds of 4096 bytes";
        if (index == 0 && m->writable)
                return "the control page is read-only for members";
        if (index > g->n_slots && !m->writable)
                return "a member page is writable by its member";
        return NULL;
}

void registry_ring_part(Registry *r, RegPeer *p, uint64_t id, const char *ring, uint32_t index, RegPublish *a,
                        Outbox *out)
{
        _cleanup_close_ int fd = steal_fd(a->fd);
        char name[PROTO_MAX_NAME + 1];
        RegRing *g = ring_lookup(r, ring);
        const char *why;
        RegBuffer *b;

        if (!g || g->owner != p) {
                reg_reply_err(out, p, id, g ? PROTO_STATUS_NOT_OWNER : PROTO_STATUS_NOT_FOUND,
                              g ? "ring '%s' belongs to another producer" : "no ring '%s'", ring);
                return;
        }
        why = part_mismatch(g, index, a);
        if (!why && a->restored && (a->generation == 0 || a->generation > r->generation))
                why = "a restored part carries the generation an earlier broker gave it";
        if (why) {
                reg_reply_err(out, p, id, PROTO_STATUS_INVALID, "ring '%s', part %u: %s", ring, index, why);
                return;
        }
        /* A part is new memory under an id nobody holds: registering it must not adopt an orphan of
         * this producer that has the id (as a restored publish would), or the reply would speak for
         * a buffer that is no part of the ring. */
        b = a->buffer ? reg_buffer_lookup(r, a->buffer) : NULL;
        if (b) {
                reg_reply_err(out, p, id, PROTO_STATUS_KEY_TAKEN, "buffer id %llu is registered already (by peer "
                              "%llu, uid %u); draw a new id for a ring part", (unsigned long long)a->buffer,
                              (unsigned long long)b->owner_id, b->owner_uid);
                return;
        }
        ring_part_name(name, sizeof(name), ring, index, g->n_slots, g->n_members);
        a->name = name;
        b = reg_buffer_register(r, p, id, a, &fd, out);
        if (!b)
                return;
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
        {
                ProtoMsg m;

                proto_reply_init(&m, id, PROTO_STATUS_OK);
                proto_set_buffer(&m, b->id);
                proto_set_generation(&m, b->generation);
                outbox_send(out, p, &m, -1);
        }
        /* Reclaims waiting for this id are refused now (a part is taken back by joining the ring),
         * not left to count against their peers' references until the grace ends. */
        reg_claims_adopt(r, b, out);
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

/* The parts a member of seat i attaches: the control page, the slots, its own page (and counters). */
static int encode_parts(const RegRing *g, uint32_t seat, ProtoItems *items)
{
        uint32_t page = 1 + g->n_slots + seat, counter = page + g->n_members;
        uint32_t n = g->n_slots + (g->mode == PROTO_MODE_STREAM ? 3 : 2);

        proto_items_init(items, PROTO_MAX_BODY / 2); /* 67 records of two numbers: a few KiB */
        for (uint32_t i = 0; i < n; i++) {
                uint32_t part = i <= g->n_slots ? i : i == g->n_slots + 1 ? page : counter;
                ProtoMsg rec;

                proto_record_init(&rec);
                proto_set_index(&rec, part);
                proto_set_buffer(&rec, g->parts[part]->id);
                if (!proto_items_add(items, &rec))
                        return -ENOMEM;
        }
        return 0;
}

void registry_ring_join(Registry *r, RegPeer *p, uint64_t id, const char *ring, Outbox *out)
{
        RegRing *g = ring_lookup(r, ring);
        ProtoItems items;
        RingSeat *s = NULL;
        bool renewing = false;
        ProtoMsg m;

        if (!g || !reg_ring_set_up(g)) {
                reg_reply_err(out, p, id, PROTO_STATUS_NOT_FOUND, g ? "ring '%s' is still being set up (%u of %u "
                              "parts registered)" : "no ring '%s'", ring, g ? g->n_registered : 0,
                              g ? ring_n_parts(g) : 0);
                return;
        }
        for (uint32_t i = 0; i < g->n_members; i++) {
                if (g->seats[i].peer == p) {
                        reg_reply_err(out, p, id, PROTO_STATUS_STATE, "this connection is a member of ring '%s' "
                                      "already (seat %u)", ring, i);
                        return;
                }
                if (s || g->seats[i].peer || g->seats[i].reserved)
                        continue;
                if (seat_has_parts(g, i))
                        s = &g->seats[i];
                else
                        renewing = true;
        }
        /* A free seat without parts gets them at the producer's next ring call: worth a retry
         * (NOT_FOUND is what a joining client waits out), unlike a ring that is full. */
        if (!s && renewing) {
                reg_reply_err(out, p, id, PROTO_STATUS_NOT_FOUND, "ring '%s' has no seat ready: its producer has "
                              "not yet given a seat that was let go new pages", ring);
                return;
        }
        if (!s) {
                reg_reply_err(out, p, id, PROTO_STATUS_QUOTA, "ring '%s' has all its %u member seats taken", ring,
                              g->n_members);
                return;
        }
        if (encode_parts(g, s->index, &items) < 0) {
                proto_items_free(&items);
                registry_peer_mark_lost(p);
                return;
        }
        s->peer = p;
        s->epoch = ++g->next_epoch;
        list_append(&p->seats, &s->peer_link);
        r->n_seated++;
        proto_reply_init(&m, id, PROTO_STATUS_OK);
        proto_set_index(&m, s->index);
        proto_set_generation(&m, s->epoch);
        proto_set_slots(&m, g->n_slots);
        proto_set_members(&m, g->n_members);
        proto_set_mode(&m, g->mode);
        proto_set_kind(&m, g->kind);
        proto_set_size(&m, g->slot_size);
        proto_set_timeout_ms(&m, g->lease_ms);
        proto_set_items(&m, proto_items_finish(&items));
        if (g->device)
                proto_set_device(&m, proto_str(g->device));
        outbox_send(out, p, &m, -1);
        proto_items_free(&items);
        ring_event(r, g->owner, PROTO_EV_MEMBER_JOINED, g, s, NULL, out);
}

static RingSeat *seat_of(RegRing *g, const RegPeer *p)
{
        for (uint32_t i = 0; g && i < g->n_members; i++)
                if (g->seats[i].peer == p)
                        return &g->seats[i];
        return NULL;
}

/* Gives member p back its seat (index, epoch) of ring g. 0, or a status (with why filled in). */
static unsigned seat_bind(Registry *r, RegRing *g, RegPeer *p, uint32_t index, uint64_t epoch, char *why, size_t cap)
{
        RingSeat *s = seat_of(g, p);

        /* As for a join: one seat per connection, whatever epochs it can name. */
        if (s) {
                snprintf(why, cap, "this connection is a member of ring '%s' already (seat %u)", g->name, s->index);
                return PROTO_STATUS_STATE;
        }
        if (index >= g->n_members) {
                snprintf(why, cap, "ring '%s' has %u seats", g->name, g->n_members);
                return PROTO_STATUS_INVALID;
        }
        s = &g->seats[index];
        if (!s->reserved || s->epoch != epoch) {
                snprintf(why, cap, "seat %u of ring '%s' is not waiting for membership %llu (its producer did not "
                         "declare it, or gave it up)", index, g->name, (unsigned long long)epoch);
                return PROTO_STATUS_REVOKED;
        }
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
        free(c);
}

/* The member-left a member gets when its seat cannot come back. */
static void seat_claim_refuse(Registry *r, SeatClaim *c, const char *why, Outbox *o)
{
        ProtoMsg m;

        proto_event_init(&m, PROTO_EV_MEMBER_LEFT);
        proto_set_name(&m, proto_str(c->ring));
        proto_set_index(&m, c->index);
        proto_set_generation(&m, c->epoch);
        proto_set_reason(&m, proto_str(why));
        outbox_send(o, c->peer, &m, -1);
        r->counters.events++;
        seat_claim_free(r, c);
}

/* A restored ring takes over the members that asked for their seats before it came back. */
static void seat_claims_settle(Registry *r, RegRing *g, Outbox *o)
{
        char why[PROTO_MAX_TEXT + 1];

        list_for_each_safe(pos, &r->seat_claims) {
                SeatClaim *c = list_entry(pos, SeatClaim, link);

                if (strcmp(c->ring, g->name) != 0)
                        continue;
                if (seat_bind(r, g, c->peer, c->index, c->epoch, why, sizeof(why)))
                        seat_claim_refuse(r, c, why, o);
                else
                        seat_claim_free(r, c);
        }
}

void registry_ring_rejoin(Registry *r, RegPeer *p, uint64_t id, const char *ring, uint32_t index, uint64_t epoch,
                          Outbox *out)
{
        RegRing *g = ring_lookup(r, ring);
        char why[PROTO_MAX_TEXT + 1];
        size_t len = strlen(ring);
        unsigned status;
        SeatClaim *c;
        ProtoMsg m;

        if (g) {
                status = seat_bind(r, g, p, index, epoch, why, sizeof(why));
                if (status)
                        reg_reply_err(out, p, id, status, "%s", why);
                else
                        reg_reply_ok(out, p, id);
                return;
        }
        if (!r->in_grace) {
                reg_reply_err(out, p, id, PROTO_STATUS_REVOKED, "ring '%s' is gone: its producer did not declare it "
                              "again within the broker's restart grace", ring);
                return;
        }
        /* Bounded per connection like its other waits, so that one peer cannot take every claim. */
        if (p->n_seat_claims >= r->limits.waits_per_peer) {
                reg_reply_err(out, p, id, PROTO_STATUS_QUOTA, "this connection waits for %u seats of rings that "
                              "are not back yet (the limit, --max-waits-per-peer)", p->n_seat_claims);
                return;
        }
        c = calloc(1, sizeof(*c) + len + 1);
        if (!c) {
                registry_peer_mark_lost(p);
                return;
        }
        c->peer = p;
        c->index = index;
        c->epoch = epoch;
        memcpy(c->ring, ring, len + 1);
        list_append(&r->seat_claims, &c->link);
        list_append(&p->seat_claims, &c->peer_link);
        p->n_seat_claims++;
        r->n_seat_claims++;
        proto_reply_init(&m, id, PROTO_STATUS_OK);
        proto_set_pending(&m, true);
        outbox_send(out, p, &m, -1);
}

void reg_rings_grace_end(Registry *r, Outbox *o)
{
        char why[PROTO_MAX_TEXT + 1];
        RegPeer *p;

        snprintf(why, sizeof(why), "the ring's producer did not declare it again within the broker's restart grace "
                 "(%u ms)", r->restart_grace_ms);
        while (!list_empty(&r->seat_claims))
                seat_claim_refuse(r, list_entry(r->seat_claims.next, SeatClaim, link), why, o);
        for (p = registry_peer_first(r); p; p = registry_peer_next(r, p))
                list_for_each(pos, &p->rings)
                        seats_unreserve(r, list_entry(pos, RegRing, owner_link), o);
}

/* Drops p's references on g's parts (an evicted member may not come back for them). */
static void drop_part_holds(Registry *r, RegRing *g, RegPeer *p, Outbox *o)
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

void registry_ring_leave(Registry *r, RegPeer *p, uint64_t id, const char *ring, Outbox *out)
{
        RingSeat *s = seat_of(ring_lookup(r, ring), p);

        if (!s) {
                reg_reply_err(out, p, id, PROTO_STATUS_NOT_FOUND, "this connection is no member of ring '%s'", ring);
                return;
        }
        reg_reply_ok(out, p, id);
        seat_free(r, s, "the member left", false, out);
}

void registry_ring_evict(Registry *r, RegPeer *p, uint64_t id, const char *ring, uint32_t index, uint64_t epoch,
                         Outbox *out)
{
        RegRing *g = ring_lookup(r, ring);
        char why[PROTO_MAX_TEXT + 1];
        RegPeer *member;
        RingSeat *s;

        if (!g || g->owner != p) {
                reg_reply_err(out, p, id, g ? PROTO_STATUS_NOT_OWNER : PROTO_STATUS_NOT_FOUND,
                              g ? "ring '%s' belongs to another producer" : "no ring '%s'", ring);
                return;
        }
        if (index >= g->n_members || g->seats[index].epoch != epoch ||
            (!g->seats[index].peer && !g->seats[index].reserved)) {
                /* It left meanwhile (its member-left event is on its way): nothing to do. */
                reg_reply_ok(out, p, id);
                return;
        }
        s = &g->seats[index];
        if (s->reserved) {
                /* Restored, and its member has not come back: the producer gives the seat up, so
                 * that a new member may take it (the producer hears member-left, as for any seat). */
                reg_reply_ok(out, p, id);
                seat_free(r, s, "evicted by the producer before its member came back after the broker restarted",
                          false, out);
                return;
        }
        member = s->peer;
        snprintf(why, sizeof(why), "evicted by the producer: it held up the ring for longer than its %u ms lease",
                 g->lease_ms);
        reg_reply_ok(out, p, id);
        /* Before the seat is freed: its page and counters are still the ring's then. */
        drop_part_holds(r, g, member, out);
        seat_free(r, s, why, true, out);
}

void registry_ring_close(Registry *r, RegPeer *p, uint64_t id, const char *ring, Outbox *out)
{
        RegRing *g = ring_lookup(r, ring);

        if (!g || g->owner != p) {
                reg_reply_err(out, p, id, g ? PROTO_STATUS_NOT_OWNER : PROTO_STATUS_NOT_FOUND,
                              g ? "ring '%s' belongs to another producer" : "no ring '%s'", ring);
                return;
        }
        reg_reply_ok(out, p, id);
        ring_destroy(r, g, "the producer closed the ring", out);
}

void reg_rings_drop_peer(Registry *r, RegPeer *p, Outbox *o)
{
        char why[160];

        while (!list_empty(&p->seat_claims))
                seat_claim_free(r, list_entry(p->seat_claims.next, SeatClaim, peer_link));

        while (!list_empty(&p->seats))
                seat_free(r, list_entry(p->seats.next, RingSeat, peer_link), "the member disconnected", false, o);
        snprintf(why, sizeof(why), "the producer (peer %llu, pid %u, uid %u) disconnected", (unsigned long long)p->id,
                 p->creds.pid, p->creds.uid);
        while (!list_empty(&p->rings))
                ring_destroy(r, list_entry(p->rings.next, RegRing, owner_link), why, o);
}
