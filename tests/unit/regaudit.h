/* White-box checks of the registry's own books, for the ring unit test and the registry fuzz
 * target: rings, seats, seat claims and the per-uid accounting must agree with each other and
 * with the buffers and peers they point at, and each ring part be attachable exactly by whom
 * docs/protocol.md 6.16 says. regenv.h checks what the public views show; this reads
 * broker/registry-internal.h on purpose, to see the pointers behind them. */
#pragma once

#include "check.h"
#include "registry-internal.h"

/* 1 control page, the slots, one page per seat, and a stream ring's counters per seat: the part
 * count docs/protocol.md 6.16 gives, stated again here rather than taken from the code under test. */
static inline uint32_t audit_ring_n_parts(const RegRing *g)
{
        return 1 + g->n_slots + g->n_members * (g->mode == PROTO_MODE_STREAM ? 2u : 1u);
}

static inline bool audit_list_has(const List *head, const List *n)
{
        list_for_each(pos, head)
                if (pos == n)
                        return true;
        return false;
}

static inline bool audit_peer_live(const Registry *r, const RegPeer *p)
{
        list_for_each(pos, &r->peers)
                if (list_entry(pos, RegPeer, link) == p)
                        return true;
        return false;
}

/* Which part p may attach, stated from docs/protocol.md 6.16 rather than taken from the code under
 * test: nothing of a closed ring, nor a page or counters let go of when a membership ended (the
 * buffer points at no ring any more); the control page and the slots every member; a seat's page
 * (and a stream ring's counters) its member only. */
static inline bool audit_part_attachable(const RegBuffer *b, const RegPeer *p)
{
        const RegRing *g = b->ring;
        uint32_t pages;

        if (!g)
                return false;
        pages = 1 + g->n_slots;
        for (uint32_t i = 0; i < g->n_members; i++)
                if (g->seats[i].peer == p)
                        return b->ring_index < pages || b->ring_index == pages + i ||
                               (g->mode == PROTO_MODE_STREAM && b->ring_index == pages + g->n_members + i);
        return false;
}

/* The rule above against the registry's, for every ring part and every peer. */
static inline void audit_part_attach_rules(const Registry *r)
{
        RegWhy why;

        list_for_each(pos, &r->buffers) {
                const RegBuffer *b = list_entry(pos, RegBuffer, link);

                if (!b->ring_part)
                        continue;
                list_for_each(pp, &r->peers) {
                        const RegPeer *p = list_entry(pp, RegPeer, link);

                        CHECK_EQ(reg_ring_attach_check(b, p, &why) == 0, audit_part_attachable(b, p));
                }
        }
}

/* One ring: its owner, parts (each a buffer pointing back at it) and seats (each empty, reserved
 * for a member coming back, or taken by a live peer that sits in no other seat of it). Returns the
 * seats taken. */
static inline uint64_t audit_ring(const Registry *r, const RegRing *g)
{
        uint32_t registered = 0;
        uint64_t seated = 0;

        CHECK(registry_ring_by_name(r, g->name) == g);
        CHECK(g->owner && audit_peer_live(r, g->owner));
        CHECK(audit_list_has(&g->owner->rings, &g->owner_link));
        CHECK(g->acct == g->owner->acct);
        CHECK(g->n_slots >= 1 && g->n_members >= 1);
        for (uint32_t i = 0; i < audit_ring_n_parts(g); i++) {
                const RegBuffer *b = g->parts[i];

                if (!b)
                        continue;
                registered++;
                CHECK(b->ring_part && b->ring == g && b->ring_index == i);
                CHECK(reg_buffer_lookup(r, b->id) == b);
                CHECK(b->owner == g->owner); /* parts are never broker-held: no orphans */
        }
        CHECK_EQ(registered, g->n_registered);
        /* Joinable once every part was in: a ring still being set up has never had them all. */
        CHECK(g->set_up || registered < audit_ring_n_parts(g));
        for (uint32_t i = 0; i < g->n_members; i++) {
                const RingSeat *s = &g->seats[i];

                CHECK(s->ring == g && s->index == i);
                /* A seat waits for its member only while members may still come back. */
                CHECK(!s->reserved || (r->in_grace && !s->peer && s->epoch > 0));
                if (!s->peer)
                        continue;
                seated++;
                CHECK(audit_peer_live(r, s->peer));
                CHECK(audit_list_has(&s->peer->seats, &s->peer_link));
                CHECK(s->epoch > 0);
                for (uint32_t j = 0; j < i; j++)
                        CHECK(g->seats[j].peer != s->peer); /* one seat per connection and ring */
        }
        return seated;
}

/* A uid's counts are exactly what it owns: connections, buffers (a ring counts as one, each part
 * as one), the memory fds the broker holds and the bytes of broker-held memory among them. */
static inline void audit_account(const Registry *r, const UidAcct *a)
{
        uint32_t connections = 0, buffers = 0, fds = 0;
        uint64_t broker_held = 0;

        list_for_each(pos, &r->peers)
                connections += list_entry(pos, RegPeer, link)->acct == a;
        list_for_each(pos, &r->buffers) {
                const RegBuffer *b = list_entry(pos, RegBuffer, link);

                buffers += b->acct == a;
                fds += b->acct == a && b->fd >= 0;
                broker_held += b->acct == a && b->fd >= 0 && b->info.broker_held ? b->info.size : 0;
        }
        CHECK_EQ(a->held_memory, broker_held);
        CHECK(!r->limits.held_memory_per_uid || broker_held <= r->limits.held_memory_per_uid);
        hmap_for_each(n, &r->rings)
                buffers += container_of(n, RegRing, node)->acct == a;
        CHECK_EQ(a->connections, connections);
        CHECK_EQ(a->buffers, buffers);
        CHECK_EQ(a->fds, fds);
        {
                uint64_t shared = 0, held = 0;

                list_for_each(pos, &r->buffers) {
                        const RegBuffer *b = list_entry(pos, RegBuffer, link);

                        shared += b->acct == a && !b->info.segment ? b->info.size : 0;
                }
                hmap_for_each(n, &r->holds) {
                        const Hold *h = container_of(n, Hold, node);

                        held += h->peer->acct == a && h->count > 0 ? h->buf->info.size : 0;
                }
                CHECK_EQ(a->shared_bytes, shared);
                CHECK_EQ(a->held_bytes, held);
        }
        CHECK(connections || buffers || fds); /* an empty account is freed */
}

/* The bytes by kind are the sums over the buffers (views not counted again) and over the holds
 * with references (each buffer once per holder); a buffer's holders are those holds. */
static inline void audit_bytes(const Registry *r)
{
        uint64_t shared[_PROTO_KIND_MAX] = { 0 }, held[_PROTO_KIND_MAX] = { 0 };

        list_for_each(pos, &r->buffers) {
                const RegBuffer *b = list_entry(pos, RegBuffer, link);
                uint32_t holders = 0;

                if (!b->info.segment)
                        shared[b->info.kind] += b->info.size;
                list_for_each(hp, &b->holds) {
                        const Hold *h = list_entry(hp, Hold, buf_link);

                        holders += h->count > 0;
                        held[b->info.kind] += h->count > 0 ? b->info.size : 0;
                }
                CHECK_EQ(b->holders, holders);
        }
        for (int k = 0; k < _PROTO_KIND_MAX; k++) {
                CHECK_EQ(r->shared_bytes[k], shared[k]);
                CHECK_EQ(r->held_bytes[k], held[k]);
        }
}

static inline void audit_accounting(const Registry *r)
{
        uint64_t held = 0;

        hmap_for_each(n, &r->uids) {
                audit_account(r, container_of(n, UidAcct, node));
                held += container_of(n, UidAcct, node)->held_memory;
        }
        CHECK_EQ(r->held_memory, held);
        audit_bytes(r);
}

static inline void audit_registry(const Registry *r)
{
        uint64_t rings = 0, seated = 0, seat_claims = 0;

        hmap_for_each(n, &r->rings) {
                rings++;
                seated += audit_ring(r, container_of(n, RegRing, node));
        }
        CHECK(rings == r->n_rings);
        CHECK_EQ(seated, r->n_seated);
        list_for_each(pos, &r->buffers) {
                const RegBuffer *b = list_entry(pos, RegBuffer, link);

                CHECK(b->ring_part || !b->ring);
                if (b->ring) {
                        CHECK(b->ring_index < audit_ring_n_parts(b->ring));
                        CHECK(b->ring->parts[b->ring_index] == b);
                }
        }
        list_for_each(pos, &r->peers) {
                const RegPeer *p = list_entry(pos, RegPeer, link);
                uint32_t claims = 0;

                list_for_each(rp, &p->rings)
                        CHECK(list_entry(rp, RegRing, owner_link)->owner == p);
                list_for_each(sp, &p->seats)
                        CHECK(list_entry(sp, RingSeat, peer_link)->peer == p);
                list_for_each(cp, &p->seat_claims) {
                        CHECK(list_entry(cp, SeatClaim, peer_link)->peer == p);
                        claims++;
                }
                CHECK_EQ(claims, p->n_seat_claims);
                CHECK(claims <= r->limits.waits_per_peer);
        }
        list_for_each(pos, &r->seat_claims) {
                const SeatClaim *c = list_entry(pos, SeatClaim, link);

                CHECK(audit_peer_live(r, c->peer));
                seat_claims++;
        }
        CHECK_EQ(seat_claims, r->n_seat_claims);
        CHECK(r->in_grace || seat_claims == 0); /* the grace's end answers every claim */
        audit_part_attach_rules(r);
        audit_accounting(r);
}
