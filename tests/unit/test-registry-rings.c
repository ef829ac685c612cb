/* broker/registry-rings.c: rings without sockets. A producer declares a ring and registers its
 * parts, members join, attach their parts, leave, are evicted or die, the ring closes, and a
 * restarted broker takes rings and seats back; in all three modes. Whenever a membership ends
 * (leave, eviction, disconnect, a seat given up after the restart grace) its page and counters are
 * let go of: nobody may attach them any more, and the seat waits until the producer registers new
 * ones. Every operation's outbox is decoded and checked (regenv.h), and the registry's own books are
 * audited after each one (regaudit.h: parts point back at their ring, seats at live peers, who may
 * attach which part, accounting adds up). */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "regenv.h"
#include "regaudit.h"
#include "ring.h"

static uint64_t next_req = 1;
static const char *const gpu_a[] = { "GPU-a" };

/* ---- a ring's shape, and what each of its parts must be ---- */

typedef struct Shape {
        const char *name;
        ProtoMode mode;
        ProtoKind kind; /* of the slots */
        uint32_t slots, members;
        uint64_t slot_size;
        const char *device; /* CUDA slots */
} Shape;

static const Shape backpressure = { "cam/bp", PROTO_MODE_BACKPRESSURE, PROTO_KIND_MEMFD, 3, 2, 8192, NULL };
static const Shape latest = { "cam/latest", PROTO_MODE_LATEST, PROTO_KIND_MEMFD, 4, 2, 4096, NULL };
static const Shape stream = { "cam/stream", PROTO_MODE_STREAM, PROTO_KIND_CUDA_VMM, 2, 3, 1 << 20, "GPU-a" };

static uint32_t n_parts(const Shape *s)
{
        return 1 + s->slots + s->members * (s->mode == PROTO_MODE_STREAM ? 2 : 1);
}

static uint32_t page_of(const Shape *s, uint32_t seat)
{
        return 1 + s->slots + seat;
}

static uint32_t counter_of(const Shape *s, uint32_t seat)
{
        return 1 + s->slots + s->members + seat;
}

typedef struct Part {
        ProtoKind kind;
        uint64_t size;
        bool writable;
        const char *device;
        uint64_t key; /* the id the producer chose (0: the broker picks) */
        bool restored;
        uint64_t generation;
        bool held;
        uint32_t retire_after;
} Part;

/* Part `index` as docs/protocol.md 6.16 describes it. */
static Part part_for(const Shape *s, uint32_t index)
{
        if (index == 0)
                return (Part){ .kind = PROTO_KIND_MEMFD, .size = RING_PAGE };
        if (index <= s->slots)
                return (Part){ .kind = s->kind, .size = s->slot_size, .device = s->device };
        if (index <= s->slots + s->members)
                return (Part){ .kind = PROTO_KIND_MEMFD, .size = RING_PAGE, .writable = true };
        return (Part){ .kind = PROTO_KIND_CUDA_VMM, .size = 256, .writable = true, .device = s->device };
}

/* ---- operations: each flushes the outbox, audits the registry and returns the reply ---- */

static size_t flush(Env *e)
{
        size_t n = env_flush(e);

        audit_registry(e->r);
        return n;
}

static Env *ring_env(const Limits *limits, uint32_t grace_ms)
{
        Env *e = calloc(1, sizeof(*e));

        CHECK(e);
        env_init_cfg(e, (RegConfig){ .limits = limits ? *limits : LIMITS_DEFAULT, .id_seed = 1,
                                     .first_generation = 100, .restart_grace_ms = grace_ms });
        return e;
}

static RegPeer *peer(Env *e, uint32_t uid)
{
        static uint32_t pid = 100;
        RegPeer *p = env_peer(e, uid, ++pid, 1);

        env_hello(e, p, 1, "ring-test", 1, gpu_a); /* cuda-vmm parts need the device in gpus */
        return p;
}

static RegRingSpec spec_of(const Shape *s)
{
        return (RegRingSpec){ .name = s->name, .kind = s->kind, .slot_size = s->slot_size, .n_slots = s->slots,
                              .n_members = s->members, .mode = s->mode, .lease_ms = 2000, .device = s->device };
}

static Sent *ring_create(Env *e, RegPeer *p, const RegRingSpec *spec)
{
        uint64_t id = next_req++;

        ENV_DO(e, p, id, registry_ring_create, spec);
        flush(e);
        return env_reply(e, p, id);
}

static void ring_create_ok(Env *e, RegPeer *p, const Shape *s)
{
        RegRingSpec spec = spec_of(s);
        Sent *r = ring_create(e, p, &spec);

        env_check_status(r, PROTO_STATUS_OK);
        CHECK_EQ(e->n_sent, 1); /* the reply, and nothing else */
}

static Sent *ring_part(Env *e, RegPeer *p, const char *ring, uint32_t index, Part o)
{
        RegPublish a = { 0 };
        uint64_t id = next_req++;

        a.info.kind = o.kind;
        a.info.size = o.size;
        a.info.writable = o.writable;
        a.device = o.device;
        a.buffer = o.key;
        a.restored = o.restored;
        a.generation = o.generation;
        a.info.broker_held = o.held;
        a.retire_after = o.retire_after;
        a.fd = env_memfd(e, 4096); /* the registry never looks inside; broker/request.c checks fds */
        ENV_DO(e, p, id, registry_ring_part, ring, index, &a);
        CHECK_EQ(a.fd, -1); /* taken in every case */
        flush(e);
        return env_reply(e, p, id);
}

static uint64_t ring_part_ok(Env *e, RegPeer *p, const Shape *s, uint32_t index)
{
        Sent *r = ring_part(e, p, s->name, index, part_for(s, index));

        env_check_status(r, PROTO_STATUS_OK);
        CHECK_EQ(e->n_sent, 1);
        CHECK(proto_has(&r->m, PF_BUFFER) && r->m.buffer > 0);
        CHECK(proto_has(&r->m, PF_GENERATION) && r->m.generation > 100);
        return r->m.buffer;
}

/* Declares the ring and registers every part; ids[i] gets part i's buffer id. */
static void ring_setup(Env *e, RegPeer *p, const Shape *s, uint64_t *ids)
{
        ring_create_ok(e, p, s);
        for (uint32_t i = 0; i < n_parts(s); i++)
                ids[i] = ring_part_ok(e, p, s, i);
}

static Sent *ring_join(Env *e, RegPeer *p, const char *ring)
{
        uint64_t id = next_req++;

        ENV_DO(e, p, id, registry_ring_join, ring);
        flush(e);
        return env_reply(e, p, id);
}

static Sent *ring_rejoin(Env *e, RegPeer *p, const char *ring, uint32_t index, uint64_t epoch)
{
        uint64_t id = next_req++;

        ENV_DO(e, p, id, registry_ring_rejoin, ring, index, epoch);
        flush(e);
        return env_reply(e, p, id);
}

static Sent *ring_leave(Env *e, RegPeer *p, const char *ring)
{
        uint64_t id = next_req++;

        ENV_DO(e, p, id, registry_ring_leave, ring);
        flush(e);
        return env_reply(e, p, id);
}

static Sent *ring_evict(Env *e, RegPeer *p, const char *ring, uint32_t index, uint64_t epoch)
{
        uint64_t id = next_req++;

        ENV_DO(e, p, id, registry_ring_evict, ring, index, epoch);
        flush(e);
        return env_reply(e, p, id);
}

static Sent *ring_close(Env *e, RegPeer *p, const char *ring)
{
        uint64_t id = next_req++;

        ENV_DO(e, p, id, registry_ring_close, ring);
        flush(e);
        return env_reply(e, p, id);
}

static Sent *attach_id(Env *e, RegPeer *p, uint64_t buffer)
{
        uint64_t id = next_req++;

        ENV_DO(e, p, id, registry_attach, id, NULL, buffer, 0, e->now);
        flush(e);
        return env_reply(e, p, id);
}

static Sent *release(Env *e, RegPeer *p, uint64_t buffer)
{
        uint64_t id = next_req++;

        ENV_DO(e, p, id, registry_release, buffer);
        flush(e);
        return env_reply(e, p, id);
}

static void remove_peer(Env *e, RegPeer *p)
{
        registry_peer_remove(e->r, p, &e->sink);
        flush(e);
}

static void expire(Env *e, uint64_t now)
{
        e->now = now;
        registry_expire(e->r, now, &e->sink);
        flush(e);
}

static RegGauges gauges(Env *e)
{
        RegGauges g;

        registry_gauges(e->r, &g);
        return g;
}

static uint64_t refs_of(Env *e, uint64_t buffer)
{
        RegBuffer *b = registry_buffer_by_id(e->r, buffer);
        ProtoMsg m;

        CHECK(b);
        reply_buffer_describe(b, &m);
        return m.refs;
}

/* ---- what the outbox must carry ---- */

/* A ring event: ring name, seat, epoch, a reason exactly for member-left, and nothing of a buffer's. */
static void check_ring_event(const Sent *s, ProtoEvent ev, const char *ring, uint32_t seat, uint64_t epoch)
{
        CHECK_EQ(s->m.type, PROTO_EVENT);
        CHECK_EQ(s->m.event, ev);
        CHECK(proto_str_eq(s->m.name, ring));
        CHECK(proto_has(&s->m, PF_INDEX) && proto_has(&s->m, PF_GENERATION));
        CHECK_EQ(s->m.index, seat);
        CHECK_EQ(s->m.generation, epoch);
        CHECK(!proto_has(&s->m, PF_BUFFER) && !proto_has(&s->m, PF_KIND));
        CHECK_EQ(proto_has(&s->m, PF_REASON), ev == PROTO_EV_MEMBER_LEFT);
        CHECK_EQ(s->fd, -1);
}

/* The one event of this kind about this ring sent to p in the last operation, checked. */
static Sent *ring_event_to(Env *e, RegPeer *p, ProtoEvent ev, const char *ring, uint32_t seat, uint64_t epoch)
{
        Sent *found = NULL;

        for (size_t i = 0; i < e->n_sent; i++) {
                Sent *s = &e->sent[i];

                if (s->to == p && s->m.type == PROTO_EVENT && s->m.event == ev && proto_str_eq(s->m.name, ring)) {
                        CHECK(!found);
                        found = s;
                }
        }
        if (!found)
                fprintf(stderr, "no %s event about ring '%s' to peer %llu\n", proto_event_name(ev), ring,
                        (unsigned long long)registry_peer_id(p));
        CHECK(found);
        check_ring_event(found, ev, ring, seat, epoch);
        return found;
}

/* A successful join: the reply names the shape and, in order, the parts this seat attaches (the
 * control page, every slot, its own page and, for a stream ring, its own counters); the producer
 * hears member-joined after it. Returns the epoch. */
static uint64_t check_joined(Env *e, const Sent *r, RegPeer *owner, const Shape *s, const uint64_t *ids,
                             uint32_t seat)
{
        uint32_t want[RING_MAX_SLOTS + 3], n = 0;
        ProtoIter it;
        ProtoMsg rec;
        Sent *ev;

        env_check_status(r, PROTO_STATUS_OK);
        CHECK_EQ(r->m.index, seat);
        CHECK(r->m.generation > 0);
        CHECK_EQ(r->m.slots, s->slots);
        CHECK_EQ(r->m.members, s->members);
        CHECK_EQ(r->m.mode, s->mode);
        CHECK_EQ(r->m.kind, s->kind);
        CHECK_EQ(r->m.size, s->slot_size);
        CHECK_EQ(r->m.timeout_ms, 2000);
        CHECK_EQ(proto_has(&r->m, PF_DEVICE), s->device != NULL);
        if (s->device)
                CHECK(proto_str_eq(r->m.device, s->device));
        for (uint32_t i = 0; i <= s->slots; i++)
                want[n++] = i;
        want[n++] = page_of(s, seat);
        if (s->mode == PROTO_MODE_STREAM)
                want[n++] = counter_of(s, seat);
        proto_iter_init(&it, &r->m.items);
        for (uint32_t i = 0; i < n; i++) {
                CHECK_EQ(proto_iter_next(&it, &rec), 1);
                CHECK_EQ(rec.index, want[i]);
                CHECK_EQ(rec.buffer, ids[want[i]]);
        }
        CHECK_EQ(proto_iter_next(&it, &rec), 0);
        ev = ring_event_to(e, owner, PROTO_EV_MEMBER_JOINED, s->name, seat, r->m.generation);
        CHECK(env_pos(e, ev) > env_pos(e, r));
        CHECK_EQ(e->n_sent, 2);
        return r->m.generation;
}

static uint64_t join_ok(Env *e, RegPeer *p, RegPeer *owner, const Shape *s, const uint64_t *ids, uint32_t seat)
{
        return check_joined(e, ring_join(e, p, s->name), owner, s, ids, seat);
}

/* ---- a seat's parts after its membership ended ---- */

/* The parts only a seat's member attaches (and writes): its page, and a stream ring's counters. */
static uint32_t n_seat_parts(const Shape *s)
{
        return s->mode == PROTO_MODE_STREAM ? 2 : 1;
}

/* Their indexes (idx holds 2); returns how many. */
static uint32_t seat_parts(const Shape *s, uint32_t seat, uint32_t *idx)
{
        idx[0] = page_of(s, seat);
        idx[1] = counter_of(s, seat);
        return n_seat_parts(s);
}

/* A join that finds no seat ready: the only free seats wait for their new parts (worth a retry,
 * unlike a full ring). */
static void join_not_ready(Env *e, RegPeer *p, const Shape *s)
{
        Sent *r = ring_join(e, p, s->name);

        env_check_status(r, PROTO_STATUS_NOT_FOUND);
        CHECK_STREQ(env_why(r, REG_E_RING_NO_SEAT_READY)->ring_no_seat_ready.ring, s->name);
        CHECK_EQ(e->n_sent, 1); /* no member-joined */
}

/* A membership of `seat` ended: its page (and counters) are the ring's no more. They stay live
 * buffers of the producer P, unnamed, but nobody may attach them: not the member that left, nor
 * the seat's next member, nor anyone in who[]. */
static void check_let_go(Env *e, RegPeer *P, const Shape *s, const uint64_t *ids, uint32_t seat, RegPeer *const *who,
                         size_t n_who)
{
        RegRing *g = registry_ring_by_name(e->r, s->name);
        uint32_t idx[2], n = seat_parts(s, seat, idx);

        CHECK(g);
        for (uint32_t k = 0; k < n; k++) {
                RegBuffer *b = registry_buffer_by_id(e->r, ids[idx[k]]);
                ProtoMsg d;

                for (size_t i = 0; i < n_who; i++) {
                        Sent *r = attach_id(e, who[i], ids[idx[k]]);

                        env_check_status(r, PROTO_STATUS_DENIED);
                        CHECK_EQ(env_why(r, REG_E_PART_OF_NO_RING)->part_of_no_ring.buffer, ids[idx[k]]);
                        CHECK_EQ(r->fd, -1);
                }
                CHECK(g->parts[idx[k]] == NULL); /* the seat waits for new ones */
                CHECK(b && registry_buffer_ring_part(b));
                reply_buffer_describe(b, &d);
                CHECK_EQ(d.owner, registry_peer_id(P));
                CHECK_EQ(d.state, PROTO_STATE_LIVE);
                CHECK(registry_buffer_by_name(e->r, registry_buffer_name(b)) != b);
        }
}

/* What the producer library does when it hears member-left: it registers the seat's new page (and
 * counters) at the same indexes. ids[] gets the new ids, old[] the ones they replace (whose
 * buffers stay the producer's until it frees them). Registering over a part that is there again
 * is refused. */
static void seat_renew(Env *e, RegPeer *P, const Shape *s, uint64_t *ids, uint32_t seat, uint64_t *old)
{
        uint32_t idx[2], n = seat_parts(s, seat, idx);
        uint64_t buffers = gauges(e).buffers;

        for (uint32_t k = 0; k < n; k++) {
                Sent *r;

                old[k] = ids[idx[k]];
                ids[idx[k]] = ring_part_ok(e, P, s, idx[k]);
                CHECK(ids[idx[k]] != old[k]);
                CHECK(registry_buffer_by_id(e->r, old[k])); /* the old one is still there */
                r = ring_part(e, P, s->name, idx[k], part_for(s, idx[k]));
                env_check_status(r, PROTO_STATUS_INVALID);
                CHECK_EQ(env_why(r, REG_E_PART_MISFIT)->part_misfit.rule, REG_PART_PART_TAKEN);
                CHECK_EQ(r->why->part_misfit.index, idx[k]);
        }
        CHECK_EQ(gauges(e).buffers, buffers + n); /* old and new alike are the producer's */
}

/* The producer frees parts it renewed (nobody holds them): they go at once. */
static void free_old_parts(Env *e, RegPeer *P, const uint64_t *old, uint32_t n)
{
        uint64_t buffers = gauges(e).buffers;

        for (uint32_t k = 0; k < n; k++) {
                uint64_t id = next_req++;

                ENV_DO(e, P, id, registry_free_buffer, old[k], false);
                flush(e);
                env_check_status(env_reply(e, P, id), PROTO_STATUS_OK);
                CHECK(registry_buffer_by_id(e->r, old[k]) == NULL);
        }
        CHECK_EQ(gauges(e).buffers, buffers - n);
}

/* ---- tests ---- */

/* Create, parts, join, attach, leave, close, in one mode. */
static void ring_lifecycle(const Shape *s)
{
        Env *e = ring_env(NULL, 0);
        RegPeer *P = peer(e, 1000), *A = peer(e, 1001), *B = peer(e, 1001), *X = peer(e, 1002);
        uint64_t ids[200], old[2], epoch_a, epoch_x;
        Sent *r;

        ring_create_ok(e, P, s);
        CHECK_EQ(gauges(e).rings, 1);
        CHECK_EQ(gauges(e).buffers, 0); /* a ring is no buffer, though it counts as one for quotas */

        /* Joinable only once every part is in. */
        r = ring_join(e, A, s->name);
        env_check_status(r, PROTO_STATUS_NOT_FOUND);
        CHECK_STREQ(env_why(r, REG_E_RING_SETTING_UP)->ring_setting_up.ring, s->name);
        CHECK_EQ(r->why->ring_setting_up.registered, 0);
        CHECK_EQ(r->why->ring_setting_up.parts, n_parts(s));
        for (uint32_t i = 0; i + 1 < n_parts(s); i++)
                ids[i] = ring_part_ok(e, P, s, i);
        r = ring_join(e, A, s->name);
        env_check_status(r, PROTO_STATUS_NOT_FOUND);
        CHECK_EQ(env_why(r, REG_E_RING_SETTING_UP)->ring_setting_up.registered, n_parts(s) - 1);
        CHECK_EQ(r->why->ring_setting_up.parts, n_parts(s));
        CHECK_EQ(e->n_sent, 1); /* no member-joined */
        ids[n_parts(s) - 1] = ring_part_ok(e, P, s, n_parts(s) - 1);
        CHECK_EQ(gauges(e).buffers, n_parts(s));
        CHECK_EQ(gauges(e).live, n_parts(s)); /* live, but under no name */
        for (uint32_t i = 0; i < n_parts(s); i++)
                CHECK(registry_buffer_by_name(e->r, registry_buffer_name(registry_buffer_by_id(e->r, ids[i]))) ==
                      NULL);

        epoch_a = join_ok(e, A, P, s, ids, 0);
        CHECK_EQ(gauges(e).ring_members, 1);
        r = ring_join(e, A, s->name);
        env_check_status(r, PROTO_STATUS_STATE);
        CHECK_STREQ(env_why(r, REG_E_RING_MEMBER)->ring_member.ring, s->name);
        CHECK_EQ(r->why->ring_member.seat, 0);

        /* A attaches what its seat may: the fd travels with each. */
        for (uint32_t i = 0; i <= s->slots; i++) {
                r = attach_id(e, A, ids[i]);
                env_check_status(r, PROTO_STATUS_OK);
                CHECK(r->fd >= 0);
        }
        r = attach_id(e, A, ids[page_of(s, 0)]);
        env_check_status(r, PROTO_STATUS_OK);
        CHECK(r->m.writable);
        if (s->mode == PROTO_MODE_STREAM)
                env_check_status(attach_id(e, A, ids[counter_of(s, 0)]), PROTO_STATUS_OK);
        /* ... and not another seat's page or counters, nor does anyone outside the ring attach anything. */
        r = attach_id(e, A, ids[page_of(s, 1)]);
        env_check_status(r, PROTO_STATUS_DENIED);
        CHECK_EQ(env_why(r, REG_E_RING_MEMBERS_ONLY)->ring_members_only.buffer, ids[page_of(s, 1)]);
        CHECK_STREQ(r->why->ring_members_only.ring, s->name);
        if (s->mode == PROTO_MODE_STREAM) {
                env_check_status(attach_id(e, A, ids[counter_of(s, 1)]), PROTO_STATUS_DENIED);
                env_check_status(attach_id(e, A, ids[counter_of(s, 2)]), PROTO_STATUS_DENIED);
        }
        for (uint32_t i = 0; i < n_parts(s); i++)
                env_check_status(attach_id(e, X, ids[i]), PROTO_STATUS_DENIED);
        /* The producer is no member either. */
        env_check_status(attach_id(e, P, ids[0]), PROTO_STATUS_DENIED);

        CHECK_EQ(join_ok(e, B, P, s, ids, 1), epoch_a + 1);
        env_check_status(attach_id(e, B, ids[page_of(s, 1)]), PROTO_STATUS_OK);
        env_check_status(attach_id(e, B, ids[page_of(s, 0)]), PROTO_STATUS_DENIED);
        for (uint32_t seat = 2; seat < s->members; seat++)
                join_ok(e, peer(e, 1003), P, s, ids, seat);
        r = ring_join(e, X, s->name);
        env_check_status(r, PROTO_STATUS_QUOTA);
        CHECK_EQ(env_why(r, REG_E_RING_FULL)->ring_full.seats, s->members);
        CHECK_EQ(e->n_sent, 1);

        /* B leaves: the producer hears it, B only gets its reply. B keeps what it mapped of its page
         * (and counters), so they are the seat's no more: nobody may attach them, B included, and
         * the seat waits for new ones (a join meanwhile is told to retry). */
        r = ring_leave(e, B, s->name);
        env_check_status(r, PROTO_STATUS_OK);
        env_why(ring_event_to(e, P, PROTO_EV_MEMBER_LEFT, s->name, 1, epoch_a + 1), REG_R_MEMBER_LEFT);
        CHECK_EQ(env_count_to(e, B), 1);
        CHECK_EQ(e->n_sent, 2);
        env_check_status(ring_leave(e, B, s->name), PROTO_STATUS_NOT_FOUND);
        env_check_status(attach_id(e, B, ids[0]), PROTO_STATUS_DENIED); /* no member any more */
        check_let_go(e, P, s, ids, 1, (RegPeer *[]){ B, X, A, P }, 4);
        CHECK_EQ(gauges(e).buffers, n_parts(s)); /* still the producer's */
        CHECK_EQ(gauges(e).live, n_parts(s));
        join_not_ready(e, X, s);

        /* The producer renews the seat; X gets it, under the new ids; the old ones stay out of
         * everyone's reach, the seat's new member's too. */
        seat_renew(e, P, s, ids, 1, old);
        epoch_x = join_ok(e, X, P, s, ids, 1);
        CHECK(epoch_x > epoch_a + 1); /* a new membership, a new epoch */
        env_check_status(attach_id(e, X, ids[page_of(s, 1)]), PROTO_STATUS_OK);
        for (uint32_t k = 0; k < n_seat_parts(s); k++) {
                r = attach_id(e, X, old[k]);
                env_check_status(r, PROTO_STATUS_DENIED);
                CHECK_EQ(env_why(r, REG_E_PART_OF_NO_RING)->part_of_no_ring.buffer, old[k]);
                env_check_status(attach_id(e, B, old[k]), PROTO_STATUS_DENIED);
        }
        env_check_status(attach_id(e, B, ids[page_of(s, 1)]), PROTO_STATUS_DENIED);
        /* Full again: that is no retry. */
        r = ring_join(e, peer(e, 1002), s->name);
        env_check_status(r, PROTO_STATUS_QUOTA);
        CHECK_EQ(env_why(r, REG_E_RING_FULL)->ring_full.seats, s->members);

        /* The producer frees the old parts: B still holds its old page, which goes once B lets go
         * (the producer hears it drained); the counters nobody held go at once. */
        ENV_DO(e, P, next_req, registry_free_buffer, old[0], false);
        flush(e);
        env_check_status(env_reply(e, P, next_req++), PROTO_STATUS_OK);
        CHECK(registry_buffer_by_id(e->r, old[0]));
        CHECK_EQ(gauges(e).buffers, n_parts(s) + n_seat_parts(s));
        env_check_status(release(e, B, old[0]), PROTO_STATUS_OK);
        CHECK_EQ(env_event(e, P, PROTO_EV_DRAINED)->m.buffer, old[0]);
        CHECK_EQ(env_event(e, B, PROTO_EV_FREED)->m.buffer, old[0]);
        CHECK(registry_buffer_by_id(e->r, old[0]) == NULL);
        free_old_parts(e, P, old + 1, n_seat_parts(s) - 1);
        CHECK_EQ(gauges(e).buffers, n_parts(s));

        /* Close: every member hears it, the producer gets its reply only; the parts stay its buffers,
         * attachable by nobody. */
        env_check_status(ring_leave(e, P, s->name), PROTO_STATUS_NOT_FOUND);
        env_check_status(ring_close(e, X, s->name), PROTO_STATUS_NOT_OWNER);
        r = ring_close(e, P, s->name);
        env_check_status(r, PROTO_STATUS_OK);
        env_why(ring_event_to(e, A, PROTO_EV_MEMBER_LEFT, s->name, 0, epoch_a), REG_R_RING_CLOSED);
        ring_event_to(e, X, PROTO_EV_MEMBER_LEFT, s->name, 1, epoch_x);
        CHECK_EQ(env_count_to(e, P), 1);
        CHECK_EQ(e->n_sent, 1 + s->members);
        CHECK_EQ(gauges(e).rings, 0);
        CHECK_EQ(gauges(e).ring_members, 0);
        CHECK_EQ(gauges(e).buffers, n_parts(s));
        r = attach_id(e, A, ids[0]);
        env_check_status(r, PROTO_STATUS_DENIED);
        CHECK_EQ(env_why(r, REG_E_PART_OF_NO_RING)->part_of_no_ring.buffer, ids[0]);
        env_check_status(ring_close(e, P, s->name), PROTO_STATUS_NOT_FOUND);
        env_check_status(ring_join(e, A, s->name), PROTO_STATUS_NOT_FOUND);
        env_check_status(release(e, A, ids[0]), PROTO_STATUS_OK); /* references stay until released */

        /* The name is free again; the producer's death takes its parts (members that mapped one hear it). */
        ring_create_ok(e, P, s);
        remove_peer(e, P);
        /* A holds the slots, its page (and counters); it mapped the control page too. */
        CHECK_EQ(env_count_events(e, A, PROTO_EV_REVOKED), s->slots + 1 + (s->mode == PROTO_MODE_STREAM));
        CHECK_EQ(env_count_events(e, A, PROTO_EV_FREED), s->slots + 2 + (s->mode == PROTO_MODE_STREAM));
        CHECK_EQ(gauges(e).buffers, 0);
        CHECK_EQ(gauges(e).rings, 0);
        env_free(e);
}

/* The whole life of a backpressure ring (create, parts, join, attach, leave, close) keeps the registry consistent. */
static void test_ring_lifecycle_backpressure(void)
{
        ring_lifecycle(&backpressure);
}

/* The same life for a latest-mode ring. */
static void test_ring_lifecycle_latest(void)
{
        ring_lifecycle(&latest);
}

/* The same life for a stream ring (cuda-vmm slots on a declared device). */
static void test_ring_lifecycle_stream(void)
{
        ring_lifecycle(&stream);
}

/* Every part index is taken exactly once and only as what it must be; each refusal says why and
 * closes the fd (the bench checks every fd is closed once). */
static void ring_parts_checked(const Shape *s)
{
        Env *e = ring_env(NULL, 0);
        RegPeer *P = peer(e, 1000), *Q = peer(e, 1000);
        uint32_t total = n_parts(s);
        Sent *r;

        ring_create_ok(e, P, s);
        env_check_status(ring_part(e, P, "no/such", 0, part_for(s, 0)), PROTO_STATUS_NOT_FOUND);
        r = ring_part(e, Q, s->name, 0, part_for(s, 0));
        env_check_status(r, PROTO_STATUS_NOT_OWNER); /* the same uid is not the producer */
        for (uint32_t i = 0; i < total; i++) {
                Part good = part_for(s, i), bad;
                bool slot = i >= 1 && i <= s->slots, counter = i > s->slots + s->members;

                bad = good;
                bad.kind = good.kind == PROTO_KIND_MEMFD ? PROTO_KIND_CUDA_VMM : PROTO_KIND_MEMFD;
                bad.device = bad.kind == PROTO_KIND_MEMFD ? NULL : "GPU-a";
                r = ring_part(e, P, s->name, i, bad);
                env_check_status(r, PROTO_STATUS_INVALID);
                CHECK_EQ(env_why(r, REG_E_PART_MISFIT)->part_misfit.rule,
                         slot ? REG_PART_SLOT_SHAPE : counter ? REG_PART_COUNTERS_SHAPE : REG_PART_PAGE_SHAPE);
                CHECK_EQ(r->why->part_misfit.index, i);
                CHECK_STREQ(r->why->part_misfit.ring, s->name);
                bad = good;
                bad.size = counter ? 127 : good.size + 1; /* counters may have any size from 128 bytes */
                env_check_status(ring_part(e, P, s->name, i, bad), PROTO_STATUS_INVALID);
                bad = good;
                bad.writable = !good.writable;
                r = ring_part(e, P, s->name, i, bad);
                env_check_status(r, PROTO_STATUS_INVALID);
                CHECK_EQ(env_why(r, REG_E_PART_MISFIT)->part_misfit.rule,
                         slot      ? REG_PART_SLOT_READ_ONLY
                         : counter ? REG_PART_COUNTERS_SHAPE
                         : i == 0  ? REG_PART_CONTROL_READ_ONLY
                                   : REG_PART_PAGE_WRITABLE);
                if (good.device) {
                        bad = good;
                        bad.device = "GPU-b";
                        r = ring_part(e, P, s->name, i, bad);
                        env_check_status(r, PROTO_STATUS_INVALID);
                        CHECK_EQ(env_why(r, REG_E_PART_MISFIT)->part_misfit.rule,
                                 counter ? REG_PART_COUNTERS_DEVICE : REG_PART_SLOT_DEVICE);
                        bad.device = NULL;
                        env_check_status(ring_part(e, P, s->name, i, bad), PROTO_STATUS_INVALID);
                }
                bad = good;
                bad.held = true;
                r = ring_part(e, P, s->name, i, bad);
                env_check_status(r, PROTO_STATUS_INVALID);
                CHECK_EQ(env_why(r, REG_E_PART_MISFIT)->part_misfit.rule, REG_PART_PART_HELD_OR_RETIRED);
                bad = good;
                bad.retire_after = 1;
                env_check_status(ring_part(e, P, s->name, i, bad), PROTO_STATUS_INVALID);
                bad = good;
                bad.restored = true; /* a generation no broker gave */
                bad.generation = 0;
                r = ring_part(e, P, s->name, i, bad);
                env_check_status(r, PROTO_STATUS_INVALID);
                CHECK_EQ(env_why(r, REG_E_PART_MISFIT)->part_misfit.rule, REG_PART_RESTORED_GENERATION);
                bad.generation = 1000000;
                env_check_status(ring_part(e, P, s->name, i, bad), PROTO_STATUS_INVALID);
                /* Refusals change nothing: the ring still waits for this part. */
                CHECK_EQ(gauges(e).buffers, i);

                ring_part_ok(e, P, s, i);
                r = ring_part(e, P, s->name, i, good);
                env_check_status(r, PROTO_STATUS_INVALID);
                CHECK_EQ(env_why(r, REG_E_PART_MISFIT)->part_misfit.rule, REG_PART_PART_TAKEN);
                CHECK_EQ(gauges(e).buffers, i + 1);
        }
        /* Past the last part, whatever it looks like. */
        for (uint32_t i = total; i < total + 3; i++) {
                r = ring_part(e, P, s->name, i, part_for(s, i));
                env_check_status(r, PROTO_STATUS_INVALID);
                CHECK_EQ(env_why(r, REG_E_PART_MISFIT)->part_misfit.rule, REG_PART_PART_BEYOND);
                CHECK_EQ(r->why->part_misfit.index, i);
        }
        r = ring_part(e, P, s->name, UINT32_MAX, part_for(s, 0));
        env_check_status(r, PROTO_STATUS_INVALID);
        CHECK_EQ(env_why(r, REG_E_PART_MISFIT)->part_misfit.rule, REG_PART_PART_BEYOND);
        CHECK_EQ(r->why->part_misfit.index, UINT32_MAX);
        CHECK_EQ(gauges(e).buffers, total);
        remove_peer(e, P);
        CHECK_EQ(gauges(e).buffers, 0);
        env_free(e);
}

/* A backpressure ring takes each part index once and only as what it must be; each refusal says why and closes the
 * fd. */
static void test_ring_parts_backpressure(void)
{
        ring_parts_checked(&backpressure);
}

/* The same part checks for a latest-mode ring. */
static void test_ring_parts_latest(void)
{
        ring_parts_checked(&latest);
}

/* The same part checks for a stream ring (cuda-vmm slots on a declared device). */
static void test_ring_parts_stream(void)
{
        ring_parts_checked(&stream);
}

/* A stream ring has 1 + K + 2C parts: the counters after the member pages, each seat's its own.
 * (A part table sized before the mode was known held 1 + K + C: registering the counters wrote
 * past it, which AddressSanitizer reports and an ordinary build may survive.) */
static void test_ring_stream_counters(void)
{
        Shape s = stream;
        Env *e = ring_env(NULL, 0);
        RegPeer *P = peer(e, 1000), *M[3];
        uint64_t ids[1 + 2 + 6], epoch[3];
        Part counter;
        Sent *r;

        s.members = 3;
        CHECK_EQ(n_parts(&s), 9);
        ring_create_ok(e, P, &s);
        for (uint32_t i = 0; i < 6; i++)
                ids[i] = ring_part_ok(e, P, &s, i);
        /* Counters from 128 bytes to 64 MiB. */
        counter = part_for(&s, 6);
        counter.size = 127;
        env_check_status(ring_part(e, P, s.name, 6, counter), PROTO_STATUS_INVALID);
        counter.size = (64u << 20) + 1;
        env_check_status(ring_part(e, P, s.name, 6, counter), PROTO_STATUS_INVALID);
        counter.size = 128;
        r = ring_part(e, P, s.name, 6, counter);
        env_check_status(r, PROTO_STATUS_OK);
        ids[6] = r->m.buffer;
        counter.size = 64u << 20;
        r = ring_part(e, P, s.name, 7, counter);
        env_check_status(r, PROTO_STATUS_OK);
        ids[7] = r->m.buffer;
        env_check_status(ring_join(e, peer(e, 1001), s.name), PROTO_STATUS_NOT_FOUND);
        ids[8] = ring_part_ok(e, P, &s, 8);
        env_check_status(ring_part(e, P, s.name, 9, part_for(&s, 8)), PROTO_STATUS_INVALID);

        for (uint32_t i = 0; i < 3; i++) {
                M[i] = peer(e, 1001);
                epoch[i] = join_ok(e, M[i], P, &s, ids, i);
        }
        for (uint32_t i = 0; i < 3; i++)
                for (uint32_t k = 0; k < 3; k++) {
                        unsigned want = i == k ? PROTO_STATUS_OK : PROTO_STATUS_DENIED;
                        env_check_status(attach_id(e, M[i], ids[counter_of(&s, k)]), want);
                        env_check_status(attach_id(e, M[i], ids[page_of(&s, k)]), want);
                }
        /* Closing and dying walk the whole table too. */
        r = ring_close(e, P, s.name);
        env_check_status(r, PROTO_STATUS_OK);
        for (uint32_t i = 0; i < 3; i++)
                ring_event_to(e, M[i], PROTO_EV_MEMBER_LEFT, s.name, i, epoch[i]);
        remove_peer(e, P);
        for (uint32_t i = 0; i < 3; i++)
                CHECK_EQ(env_count_events(e, M[i], PROTO_EV_REVOKED), 2); /* its page and its counters */
        env_free(e);
}

/* The producer evicts a membership by its epoch: a stale one changes nothing; the current one
 * frees the seat, tells both sides, and drops the member's references on the ring's parts (only
 * those). */
static void test_ring_evict(void)
{
        const Shape *s = &backpressure;
        Env *e = ring_env(NULL, 0);
        RegPeer *P = peer(e, 1000), *A = peer(e, 1001), *B = peer(e, 1001);
        uint64_t ids[8], old[2], epoch_a, other;
        unsigned drained = 0;
        RegPublish pub = { .name = "other", .info = { .kind = PROTO_KIND_MEMFD, .size = 4096 } };
        Sent *r, *left;

        ring_setup(e, P, s, ids);
        pub.fd = env_memfd(e, 4096);
        ENV_DO(e, P, next_req++, registry_publish, &pub);
        flush(e);
        other = e->sent[0].m.buffer;
        epoch_a = join_ok(e, A, P, s, ids, 0);
        for (uint32_t i = 0; i <= s->slots; i++)
                env_check_status(attach_id(e, A, ids[i]), PROTO_STATUS_OK);
        env_check_status(attach_id(e, A, ids[0]), PROTO_STATUS_OK); /* two references on the control page */
        env_check_status(attach_id(e, A, ids[page_of(s, 0)]), PROTO_STATUS_OK);
        env_check_status(attach_id(e, A, other), PROTO_STATUS_OK);
        CHECK_EQ(refs_of(e, ids[0]), 2);

        env_check_status(ring_evict(e, A, s->name, 0, epoch_a), PROTO_STATUS_NOT_OWNER);
        env_check_status(ring_evict(e, P, "no/such", 0, epoch_a), PROTO_STATUS_NOT_FOUND);
        /* Stale epochs and seats that do not exist: answered, nothing else. */
        env_check_status(ring_evict(e, P, s->name, 0, epoch_a + 1), PROTO_STATUS_OK);
        CHECK_EQ(e->n_sent, 1);
        env_check_status(ring_evict(e, P, s->name, 0, epoch_a - 1), PROTO_STATUS_OK);
        CHECK_EQ(e->n_sent, 1);
        env_check_status(ring_evict(e, P, s->name, 1, epoch_a), PROTO_STATUS_OK); /* an empty seat */
        CHECK_EQ(e->n_sent, 1);
        env_check_status(ring_evict(e, P, s->name, 7, epoch_a), PROTO_STATUS_OK);
        CHECK_EQ(e->n_sent, 1);
        CHECK_EQ(gauges(e).ring_members, 1);
        CHECK_EQ(refs_of(e, ids[0]), 2);

        /* The lease ran out: the reply first, then member-left to the producer and the member. */
        r = ring_evict(e, P, s->name, 0, epoch_a);
        env_check_status(r, PROTO_STATUS_OK);
        left = ring_event_to(e, P, PROTO_EV_MEMBER_LEFT, s->name, 0, epoch_a);
        CHECK_EQ(env_why(left, REG_R_EVICTED_LEASE)->evicted_lease.lease_ms, 2000);
        CHECK(env_pos(e, left) > env_pos(e, r));
        env_why(ring_event_to(e, A, PROTO_EV_MEMBER_LEFT, s->name, 0, epoch_a), REG_R_EVICTED_LEASE);
        CHECK_EQ(e->n_sent, 3);
        CHECK_EQ(gauges(e).ring_members, 0);
        /* Its page among them: dropped while it was still the ring's, before the seat let go of it. */
        for (uint32_t i = 0; i < n_parts(s); i++)
                CHECK_EQ(refs_of(e, ids[i]), 0);
        CHECK_EQ(refs_of(e, other), 1); /* not a part: untouched */
        env_check_status(release(e, A, ids[0]), PROTO_STATUS_NOT_ATTACHED);
        env_check_status(attach_id(e, A, ids[0]), PROTO_STATUS_DENIED);
        check_let_go(e, P, s, ids, 0, (RegPeer *[]){ A, B, P }, 3);
        /* Evicting it again is a stale eviction. */
        env_check_status(ring_evict(e, P, s->name, 0, epoch_a), PROTO_STATUS_OK);
        CHECK_EQ(e->n_sent, 1);

        /* Renewed, the seat is free for the next member, under a new epoch (until then a join takes
         * seat 1, which has its parts); one that left is no eviction. */
        seat_renew(e, P, s, ids, 0, old);
        free_old_parts(e, P, old, 1);
        CHECK(join_ok(e, B, P, s, ids, 0) > epoch_a);
        env_check_status(attach_id(e, B, old[0]), PROTO_STATUS_NOT_FOUND); /* freed */
        r = ring_leave(e, B, s->name);
        env_check_status(r, PROTO_STATUS_OK);
        env_check_status(ring_evict(e, P, s->name, 0, epoch_a + 1), PROTO_STATUS_OK);
        CHECK_EQ(e->n_sent, 1);

        /* Evicting the last holder of a retired part drains it; its page too, which the producer
         * freed while the member held it (it went once the eviction dropped the member's hold). */
        seat_renew(e, P, s, ids, 0, old);
        free_old_parts(e, P, old, 1);
        epoch_a = join_ok(e, A, P, s, ids, 0);
        env_check_status(attach_id(e, A, ids[1]), PROTO_STATUS_OK);
        env_check_status(attach_id(e, A, ids[page_of(s, 0)]), PROTO_STATUS_OK);
        ENV_DO(e, P, next_req++, registry_retire, ids[1], false);
        flush(e);
        ENV_DO(e, P, next_req++, registry_free_buffer, ids[page_of(s, 0)], false);
        flush(e);
        CHECK_EQ(env_count_events(e, P, PROTO_EV_DRAINED), 0);
        CHECK_EQ(refs_of(e, ids[page_of(s, 0)]), 1);
        r = ring_evict(e, P, s->name, 0, epoch_a);
        env_check_status(r, PROTO_STATUS_OK);
        CHECK_EQ(env_count_events(e, P, PROTO_EV_DRAINED), 2);
        for (size_t i = 0; i < e->n_sent; i++) {
                const ProtoMsg *m = &e->sent[i].m;

                if (e->sent[i].to == P && m->type == PROTO_EVENT && m->event == PROTO_EV_DRAINED)
                        drained |= m->buffer == ids[1] ? 1u : m->buffer == ids[page_of(s, 0)] ? 2u : 4u;
        }
        CHECK_EQ(drained, 3u);
        CHECK(registry_buffer_by_id(e->r, ids[page_of(s, 0)]) == NULL);
        CHECK_EQ(refs_of(e, ids[1]), 0);
        env_free(e);
}

/* The producer disconnects: members hear member-left first, then revoked for the parts they hold. */
static void test_ring_owner_disconnects(void)
{
        const Shape *s = &latest;
        Env *e = ring_env(NULL, 0);
        RegPeer *P = peer(e, 1000), *A = peer(e, 1001), *B = peer(e, 1001);
        uint64_t ids[8], epoch_a, epoch_b, producer;
        Sent *left, *revoked;

        ring_setup(e, P, s, ids);
        epoch_a = join_ok(e, A, P, s, ids, 0);
        epoch_b = join_ok(e, B, P, s, ids, 1);
        env_check_status(attach_id(e, A, ids[0]), PROTO_STATUS_OK);
        env_check_status(attach_id(e, A, ids[2]), PROTO_STATUS_OK);
        producer = registry_peer_id(P);
        remove_peer(e, P);
        left = ring_event_to(e, A, PROTO_EV_MEMBER_LEFT, s->name, 0, epoch_a);
        CHECK_EQ(env_why(left, REG_R_RING_PRODUCER_GONE)->ring_producer_gone.producer.peer, producer);
        CHECK_EQ(left->why->ring_producer_gone.producer.uid, 1000);
        ring_event_to(e, B, PROTO_EV_MEMBER_LEFT, s->name, 1, epoch_b);
        CHECK_EQ(env_count_events(e, A, PROTO_EV_REVOKED), 2);
        revoked = env_event(e, A, PROTO_EV_REVOKED);
        CHECK(env_pos(e, revoked) > env_pos(e, left));
        CHECK_EQ(env_count_events(e, A, PROTO_EV_FREED), 2);
        CHECK_EQ(env_count_to(e, B), 1);
        CHECK_EQ(gauges(e).rings, 0);
        CHECK_EQ(gauges(e).ring_members, 0);
        CHECK_EQ(gauges(e).buffers, 0);
        CHECK_EQ(gauges(e).refs, 0);
        env_check_status(ring_leave(e, A, s->name), PROTO_STATUS_NOT_FOUND);
        env_free(e);
}

/* A member disconnects: the producer hears member-left, the seat and the references go. */
static void test_ring_member_disconnects(void)
{
        const Shape *s = &stream;
        Env *e = ring_env(NULL, 0);
        RegPeer *P = peer(e, 1000), *A = peer(e, 1001), *B = peer(e, 1001), *C = peer(e, 1002);
        uint64_t ids[16], old[2], epoch_a;
        Sent *left;

        ring_setup(e, P, s, ids);
        epoch_a = join_ok(e, A, P, s, ids, 0);
        env_check_status(attach_id(e, A, ids[counter_of(s, 0)]), PROTO_STATUS_OK);
        remove_peer(e, A);
        left = ring_event_to(e, P, PROTO_EV_MEMBER_LEFT, s->name, 0, epoch_a);
        env_why(left, REG_R_MEMBER_GONE);
        CHECK_EQ(e->n_sent, 1);
        CHECK_EQ(gauges(e).ring_members, 0);
        CHECK_EQ(refs_of(e, ids[counter_of(s, 0)]), 0);
        /* Its page and counters went with its membership: seat 0 waits for new ones, so a join
         * takes seat 1, which has its own; seat 0, renewed, goes to the next one. */
        check_let_go(e, P, s, ids, 0, (RegPeer *[]){ B, C, P }, 3);
        CHECK(join_ok(e, B, P, s, ids, 1) > epoch_a);
        seat_renew(e, P, s, ids, 0, old);
        join_ok(e, C, P, s, ids, 0);
        for (uint32_t k = 0; k < 2; k++)
                env_check_status(attach_id(e, C, old[k]), PROTO_STATUS_DENIED);
        free_old_parts(e, P, old, 2);
        /* A member that is also the producer of another ring: both go. */
        {
                Shape s2 = latest;
                uint64_t ids2[8];

                s2.name = "b/own";
                ring_setup(e, B, &s2, ids2);
                join_ok(e, P, B, &s2, ids2, 0);
                remove_peer(e, B);
                ring_event_to(e, P, PROTO_EV_MEMBER_LEFT, s->name, 1, epoch_a + 1);
                env_why(ring_event_to(e, P, PROTO_EV_MEMBER_LEFT, s2.name, 0, 1), REG_R_RING_PRODUCER_GONE);
                CHECK_EQ(gauges(e).rings, 1);
        }
        env_free(e);
}

/* A ring counts as one buffer of its producer's uid and each part as one more; parts count fds. */
static void test_ring_quotas(void)
{
        Limits limits = LIMITS_DEFAULT;
        Shape s = backpressure;
        Env *e;
        RegPeer *P, *Q;
        RegPublish pub = { .name = "x", .info = { .kind = PROTO_KIND_MEMFD, .size = 4096 } };
        RegRingSpec spec;
        uint64_t ids[4], extra;
        Sent *r;

        limits.buffers_per_uid = 5;
        limits.fds_per_uid = 100;
        e = ring_env(&limits, 0);
        P = peer(e, 1000);
        Q = peer(e, 1000); /* the same uid: the same account */
        s.slots = 1;
        s.members = 1; /* 3 parts: with the ring, 4 buffers */
        ring_setup(e, P, &s, ids);
        pub.fd = env_memfd(e, 4096);
        ENV_DO(e, Q, next_req++, registry_publish, &pub);
        flush(e);
        env_check_status(&e->sent[0], PROTO_STATUS_OK);
        extra = e->sent[0].m.buffer;
        s.name = "cam/second";
        spec = spec_of(&s);
        r = ring_create(e, Q, &spec);
        env_check_status(r, PROTO_STATUS_QUOTA);
        CHECK_EQ(env_why(r, REG_E_RING_BUFFERS_LIMIT)->ring_buffers_limit.uid, 1000);
        ENV_DO(e, Q, next_req++, registry_free_buffer, extra, false);
        flush(e);
        ring_create_ok(e, Q, &s); /* 5 */
        r = ring_part(e, Q, s.name, 0, part_for(&s, 0));
        env_check_status(r, PROTO_STATUS_QUOTA);
        CHECK_EQ(env_why(r, REG_E_BUFFERS_LIMIT)->buffers_limit.buffers, 5);
        /* Closing gives the ring's own count back; its parts count until freed. */
        env_check_status(ring_close(e, P, backpressure.name), PROTO_STATUS_OK);
        ids[3] = ring_part_ok(e, Q, &s, 0);
        env_check_status(ring_part(e, Q, s.name, 1, part_for(&s, 1)), PROTO_STATUS_QUOTA);
        for (uint32_t i = 0; i < 3; i++) {
                ENV_DO(e, P, next_req++, registry_free_buffer, ids[i], false);
                flush(e);
        }
        ring_part_ok(e, Q, &s, 1);
        ring_part_ok(e, Q, &s, 2);
        remove_peer(e, Q);
        remove_peer(e, P);
        CHECK_EQ(e->r->uids.count, 0); /* every account emptied and freed */
        env_free(e);

        /* The fd quota: a part is refused once the uid's fds are all taken. */
        limits = LIMITS_DEFAULT;
        limits.fds_per_uid = 2;
        e = ring_env(&limits, 0);
        P = peer(e, 1000);
        s = backpressure;
        ring_create_ok(e, P, &s);
        ring_part_ok(e, P, &s, 0);
        ring_part_ok(e, P, &s, 1);
        r = ring_part(e, P, s.name, 2, part_for(&s, 2));
        env_check_status(r, PROTO_STATUS_QUOTA);
        env_why(r, REG_E_FDS_LIMIT);
        env_free(e);
}

/* Ring names are their own namespace, one ring per name. */
static void test_ring_names(void)
{
        Env *e = ring_env(NULL, 0);
        RegPeer *P = peer(e, 1000), *Q = peer(e, 1001);
        RegPublish pub = { .name = "cam/bp", .info = { .kind = PROTO_KIND_MEMFD, .size = 4096 } };
        RegRingSpec spec = spec_of(&backpressure);
        Sent *r;

        pub.fd = env_memfd(e, 4096);
        ENV_DO(e, Q, next_req++, registry_publish, &pub);
        flush(e);
        env_check_status(&e->sent[0], PROTO_STATUS_OK);
        ring_create_ok(e, P, &backpressure); /* a buffer of that name is no ring */
        r = ring_create(e, Q, &spec);
        env_check_status(r, PROTO_STATUS_NAME_TAKEN);
        CHECK_STREQ(env_why(r, REG_E_RING_EXISTS)->ring_exists.ring, spec.name);
        env_check_status(ring_create(e, P, &spec), PROTO_STATUS_NAME_TAKEN);
        env_check_status(ring_join(e, Q, "cam"), PROTO_STATUS_NOT_FOUND);
        CHECK_EQ(gauges(e).rings, 1);
        env_free(e);
}

/* A part freed after members joined: joining waits for it again, and it can be registered anew. */
static void test_ring_part_freed(void)
{
        const Shape *s = &backpressure;
        Env *e = ring_env(NULL, 0);
        RegPeer *P = peer(e, 1000), *A = peer(e, 1001), *B = peer(e, 1001);
        uint64_t ids[8];
        Sent *r;

        ring_setup(e, P, s, ids);
        join_ok(e, A, P, s, ids, 0);
        env_check_status(attach_id(e, A, ids[2]), PROTO_STATUS_OK);
        ENV_DO(e, P, next_req++, registry_free_buffer, ids[2], false);
        flush(e);
        env_check_status(release(e, A, ids[2]), PROTO_STATUS_OK); /* the last reference: now it goes */
        CHECK_EQ(env_count_events(e, A, PROTO_EV_FREED), 1);
        CHECK(registry_buffer_by_id(e->r, ids[2]) == NULL);
        r = ring_join(e, B, s->name);
        env_check_status(r, PROTO_STATUS_NOT_FOUND);
        CHECK_EQ(env_why(r, REG_E_RING_SETTING_UP)->ring_setting_up.registered, 5);
        CHECK_EQ(r->why->ring_setting_up.parts, 6);
        ids[2] = ring_part_ok(e, P, s, 2);
        join_ok(e, B, P, s, ids, 1);
        env_free(e);
}

/* After a restart: the producer declares its ring again with the seats it counts as seated; their
 * members take them back by index and epoch; new members get other seats and newer epochs; seats
 * nobody came back for are freed when the grace ends. */
static void test_ring_restored(void)
{
        Shape s = backpressure;
        Env *e = ring_env(NULL, 1000);
        RegPeer *P = peer(e, 1000), *A = peer(e, 1001), *C = peer(e, 1001), *D = peer(e, 1001);
        uint64_t epochs[3] = { 5, 0, 7 }, ids[8], old[2];
        RegRingSpec spec;
        Sent *r;

        s.members = 3;
        spec = spec_of(&s);
        spec.restored = true;
        spec.next_epoch = 9;
        spec.epochs = epochs;
        r = ring_create(e, P, &spec);
        env_check_status(r, PROTO_STATUS_OK);
        CHECK_EQ(e->n_sent, 1);
        CHECK_EQ(gauges(e).ring_members, 0); /* waiting seats are nobody's yet */

        /* A takes seat 0 back before the parts are in; wrong seats and epochs are refused. */
        r = ring_rejoin(e, A, s.name, 0, 5);
        env_check_status(r, PROTO_STATUS_OK);
        CHECK(!proto_has(&r->m, PF_PENDING));
        CHECK_EQ(e->n_sent, 1); /* the producer already counts it */
        CHECK_EQ(gauges(e).ring_members, 1);
        r = ring_rejoin(e, C, s.name, 2, 6);
        env_check_status(r, PROTO_STATUS_REVOKED);
        CHECK_EQ(env_why(r, REG_E_SEAT_NOT_WAITING)->seat_not_waiting.epoch, 6);
        CHECK_EQ(r->why->seat_not_waiting.seat, 2);
        env_check_status(ring_rejoin(e, C, s.name, 1, 0), PROTO_STATUS_REVOKED); /* not declared */
        env_check_status(ring_rejoin(e, C, s.name, 0, 5), PROTO_STATUS_REVOKED); /* taken back already */
        r = ring_rejoin(e, C, s.name, 3, 5);
        env_check_status(r, PROTO_STATUS_INVALID);
        CHECK_EQ(env_why(r, REG_E_RING_SEATS)->ring_seats.seats, 3);

        /* Restored parts keep their generations. */
        for (uint32_t i = 0; i < n_parts(&s); i++) {
                Part part = part_for(&s, i);

                part.restored = true;
                part.generation = 50 + i;
                part.key = 9000 + i;
                r = ring_part(e, P, s.name, i, part);
                env_check_status(r, PROTO_STATUS_OK);
                CHECK_EQ(r->m.buffer, 9000 + i);
                CHECK_EQ(r->m.generation, 50 + i);
                ids[i] = r->m.buffer;
        }
        env_check_status(attach_id(e, A, ids[page_of(&s, 0)]), PROTO_STATUS_OK);
        /* A new member gets the one free seat and an epoch after every declared one. */
        CHECK_EQ(join_ok(e, C, P, &s, ids, 1), 10);
        r = ring_join(e, D, s.name);
        env_check_status(r, PROTO_STATUS_QUOTA); /* seat 2 waits for its member */

        /* The grace ends: seat 2's member never came; the producer hears it; D gets the seat. */
        expire(e, 999);
        CHECK_EQ(e->n_sent, 0);
        expire(e, 1000);
        r = ring_event_to(e, P, PROTO_EV_MEMBER_LEFT, s.name, 2, 7);
        CHECK_EQ(env_why(r, REG_R_MEMBER_GRACE_OVER)->member_grace_over.grace_ms, 1000);
        CHECK_EQ(e->n_sent, 1);
        /* Its member may still have its page mapped from before the restart: the seat waits for a
         * new one, and the old one is nobody's to attach. */
        check_let_go(e, P, &s, ids, 2, (RegPeer *[]){ D, A, C }, 3);
        join_not_ready(e, D, &s);
        seat_renew(e, P, &s, ids, 2, old);
        CHECK_EQ(join_ok(e, D, P, &s, ids, 2), 11);
        env_check_status(attach_id(e, D, old[0]), PROTO_STATUS_DENIED);
        free_old_parts(e, P, old, 1);
        env_check_status(ring_rejoin(e, peer(e, 1001), s.name, 2, 7), PROTO_STATUS_REVOKED);
        /* Taking a seat back after the grace, of a ring that is gone, is refused at once. */
        r = ring_rejoin(e, A, "gone/ring", 0, 1);
        env_check_status(r, PROTO_STATUS_REVOKED);
        CHECK_STREQ(env_why(r, REG_E_RING_GONE)->ring_gone.ring, "gone/ring");
        env_free(e);
}

/* Members back before their ring: their claims wait (pending), are settled when the ring is
 * declared again, and are refused with member-left when the grace ends without it. */
static void test_ring_seat_claims(void)
{
        Shape s = backpressure;
        Env *e = ring_env(NULL, 1000);
        RegPeer *P = peer(e, 1000), *A = peer(e, 1001), *B = peer(e, 1001), *Z = peer(e, 1001),
                *X = peer(e, 1001);
        uint64_t epochs[3] = { 5, 4, 0 }, ids[8];
        RegRingSpec spec;
        Sent *r, *reply;

        s.members = 3;
        r = ring_rejoin(e, A, s.name, 0, 5);
        env_check_status(r, PROTO_STATUS_OK);
        CHECK(proto_has(&r->m, PF_PENDING) && r->m.pending);
        CHECK(ring_rejoin(e, B, s.name, 1, 3)->m.pending); /* an epoch the producer no longer counts */
        CHECK(ring_rejoin(e, Z, "other/ring", 0, 1)->m.pending);
        CHECK(ring_rejoin(e, X, s.name, 2, 1)->m.pending);
        CHECK_EQ(e->r->n_seat_claims, 4);
        remove_peer(e, X); /* its claim goes with it, silently */
        CHECK_EQ(e->n_sent, 0);
        CHECK_EQ(e->r->n_seat_claims, 3);

        spec = spec_of(&s);
        spec.restored = true;
        spec.next_epoch = 6;
        spec.epochs = epochs;
        ENV_DO(e, P, 77, registry_ring_create, &spec);
        flush(e);
        reply = env_reply(e, P, 77);
        env_check_status(reply, PROTO_STATUS_OK);
        r = ring_event_to(e, B, PROTO_EV_MEMBER_LEFT, s.name, 1, 3);
        CHECK_EQ(env_why(r, REG_E_SEAT_NOT_WAITING)->seat_not_waiting.epoch, 3);
        CHECK_EQ(r->why->seat_not_waiting.seat, 1);
        CHECK(env_pos(e, r) > env_pos(e, reply));
        CHECK_EQ(env_count_to(e, A), 0); /* seated silently: it was told "pending" */
        CHECK_EQ(e->n_sent, 2);
        CHECK_EQ(gauges(e).ring_members, 1);
        CHECK_EQ(e->r->n_seat_claims, 1);
        env_check_status(ring_leave(e, A, s.name), PROTO_STATUS_OK); /* really a member */
        ring_event_to(e, P, PROTO_EV_MEMBER_LEFT, s.name, 0, 5);
        for (uint32_t i = 0; i < n_parts(&s); i++)
                ids[i] = ring_part_ok(e, P, &s, i);

        /* The grace ends: Z's ring never came back, seat 1's member never did. */
        expire(e, 1000);
        r = ring_event_to(e, Z, PROTO_EV_MEMBER_LEFT, "other/ring", 0, 1);
        CHECK_EQ(env_why(r, REG_R_RING_GRACE_OVER)->ring_grace_over.grace_ms, 1000);
        ring_event_to(e, P, PROTO_EV_MEMBER_LEFT, s.name, 1, 4);
        CHECK_EQ(e->n_sent, 2);
        CHECK_EQ(e->r->n_seat_claims, 0);
        r = ring_rejoin(e, Z, "other/ring", 0, 1);
        env_check_status(r, PROTO_STATUS_REVOKED);
        join_ok(e, Z, P, &s, ids, 0);
        env_free(e);
}

/* Fixed: a reclaim waiting for an id that then came back as a ring part stayed pending (counting
 * against the member's references) until the grace ended, and was then refused as if its producer
 * never came back. A part is taken back by joining the ring: the claim is refused at once. */
static void test_ring_part_refuses_claims(void)
{
        Env *e = ring_env(NULL, 1000);
        RegPeer *P = peer(e, 1000), *C = peer(e, 1001);
        RegReclaim rec = { .buffer = 9000, .generation = 50, .refs = 2, .owner_uid = 1000, .name = "cam/bp@ctl",
                           .kind = PROTO_KIND_MEMFD };
        Part part;
        Sent *r;

        ENV_DO(e, C, 55, registry_reclaim, &rec);
        flush(e);
        CHECK(env_reply(e, C, 55)->m.pending);
        CHECK_EQ(gauges(e).claims_pending, 1);
        ring_create_ok(e, P, &backpressure);
        part = part_for(&backpressure, 0);
        part.key = 9000;
        part.restored = true;
        part.generation = 50;
        r = ring_part(e, P, backpressure.name, 0, part);
        env_check_status(r, PROTO_STATUS_OK);
        r = env_event(e, C, PROTO_EV_REVOKED);
        CHECK_EQ(r->m.buffer, 9000);
        CHECK_EQ(env_why(r, REG_E_CLAIM_RING_PART)->claim_ring_part.buffer, 9000);
        CHECK_EQ(gauges(e).claims_pending, 0);
        CHECK_EQ(refs_of(e, 9000), 0);
        env_free(e);
}

/* Fixed: evicting a restored seat whose member has not come back left it reserved, so no new
 * member could take it until the grace ended (and never, for a ring restored after the grace). */
static void test_ring_evict_reserved_seat(void)
{
        Shape s = backpressure;
        Env *e = ring_env(NULL, 1000);
        RegPeer *P = peer(e, 1000), *A = peer(e, 1001), *B = peer(e, 1001);
        uint64_t epochs[1] = { 3 }, ids[8], old[2];
        RegRingSpec spec;
        Sent *r;

        s.members = 1;
        spec = spec_of(&s);
        spec.restored = true;
        spec.next_epoch = 3;
        spec.epochs = epochs;
        env_check_status(ring_create(e, P, &spec), PROTO_STATUS_OK);
        for (uint32_t i = 0; i < n_parts(&s); i++)
                ids[i] = ring_part_ok(e, P, &s, i);
        env_check_status(ring_join(e, A, s.name), PROTO_STATUS_QUOTA);
        env_check_status(ring_evict(e, P, s.name, 0, 2), PROTO_STATUS_OK); /* another epoch: nothing */
        CHECK_EQ(e->n_sent, 1);
        r = ring_evict(e, P, s.name, 0, 3);
        env_check_status(r, PROTO_STATUS_OK);
        env_why(ring_event_to(e, P, PROTO_EV_MEMBER_LEFT, s.name, 0, 3), REG_R_EVICTED_UNRETURNED);
        CHECK_EQ(e->n_sent, 2);
        env_check_status(ring_rejoin(e, B, s.name, 0, 3), PROTO_STATUS_REVOKED);
        /* The membership given up may have the page mapped: the seat gets a new one first. */
        check_let_go(e, P, &s, ids, 0, (RegPeer *[]){ A, B }, 2);
        join_not_ready(e, A, &s);
        seat_renew(e, P, &s, ids, 0, old);
        CHECK_EQ(join_ok(e, A, P, &s, ids, 0), 4);
        env_free(e);
}

/* Fixed: a ring declared again after the grace (its producer came back late, or only its
 * connection dropped) kept its declared seats reserved for good. */
static void test_ring_restored_after_grace(void)
{
        Shape s = backpressure;
        Env *e = ring_env(NULL, 0);
        RegPeer *P = peer(e, 1000), *A = peer(e, 1001), *B = peer(e, 1001);
        uint64_t epochs[2] = { 4, 0 }, ids[8];
        RegRingSpec spec;
        Sent *r, *left;

        CHECK(!registry_in_grace(e->r));
        spec = spec_of(&s);
        spec.restored = true;
        spec.next_epoch = 4;
        spec.epochs = epochs;
        r = ring_create(e, P, &spec);
        env_check_status(r, PROTO_STATUS_OK);
        left = ring_event_to(e, P, PROTO_EV_MEMBER_LEFT, s.name, 0, 4);
        /* No grace: it is over at once. */
        CHECK_EQ(env_why(left, REG_R_MEMBER_GRACE_OVER)->member_grace_over.grace_ms, 0);
        CHECK(env_pos(e, left) > env_pos(e, r));
        CHECK_EQ(e->n_sent, 2);
        env_check_status(ring_rejoin(e, B, s.name, 0, 4), PROTO_STATUS_REVOKED);
        for (uint32_t i = 0; i < n_parts(&s); i++)
                ids[i] = ring_part_ok(e, P, &s, i);
        CHECK_EQ(join_ok(e, A, P, &s, ids, 0), 5);
        CHECK_EQ(join_ok(e, B, P, &s, ids, 1), 6);
        env_free(e);
}

/* Fixed: a ring part registered under the id of an orphan of its producer's uid adopted the orphan
 * (as a restored publish does): the reply said ok, yet the ring never got the part. */
static void test_ring_part_never_adopts(void)
{
        const Shape *s = &backpressure;
        Env *e = ring_env(NULL, 0);
        RegPeer *P1 = peer(e, 1000), *P2 = peer(e, 1000), *M = peer(e, 1001);
        RegPublish pub = { .name = "held", .buffer = 77,
                           .info = { .kind = PROTO_KIND_MEMFD, .size = 4096, .broker_held = true } };
        uint64_t generation;
        ProtoMsg d;
        Part part;
        Sent *r;

        pub.fd = env_memfd(e, 4096);
        ENV_DO(e, P1, next_req++, registry_publish, &pub);
        flush(e);
        env_check_status(&e->sent[0], PROTO_STATUS_OK);
        generation = e->sent[0].m.generation;
        remove_peer(e, P1);
        CHECK_EQ(gauges(e).orphaned, 1);

        ring_create_ok(e, P2, s);
        part = part_for(s, 0);
        part.key = 77;
        part.restored = true;
        part.generation = generation;
        r = ring_part(e, P2, s->name, 0, part);
        env_check_status(r, PROTO_STATUS_KEY_TAKEN);
        CHECK_EQ(gauges(e).orphaned, 1); /* still the broker's */
        reply_buffer_describe(registry_buffer_by_id(e->r, 77), &d);
        CHECK_EQ(d.owner, 0);
        part.restored = false;
        env_check_status(ring_part(e, P2, s->name, 0, part), PROTO_STATUS_KEY_TAKEN);
        r = ring_join(e, M, s->name);
        CHECK_EQ(env_why(r, REG_E_RING_SETTING_UP)->ring_setting_up.registered, 0);
        CHECK_EQ(r->why->ring_setting_up.parts, 6);
        part.key = 78;
        env_check_status(ring_part(e, P2, s->name, 0, part), PROTO_STATUS_OK);
        env_free(e);
}

/* Fixed: one connection could take two seats of a ring back (a join refuses a second seat). */
static void test_ring_one_seat_per_member(void)
{
        Shape s = latest;
        Env *e = ring_env(NULL, 1000);
        RegPeer *P = peer(e, 1000), *A = peer(e, 1001), *B = peer(e, 1001);
        uint64_t epochs[2] = { 1, 2 };
        RegRingSpec spec;
        Sent *r;

        spec = spec_of(&s);
        spec.restored = true;
        spec.next_epoch = 2;
        spec.epochs = epochs;
        env_check_status(ring_create(e, P, &spec), PROTO_STATUS_OK);
        env_check_status(ring_rejoin(e, A, s.name, 0, 1), PROTO_STATUS_OK);
        r = ring_rejoin(e, A, s.name, 1, 2);
        env_check_status(r, PROTO_STATUS_STATE);
        CHECK_EQ(env_why(r, REG_E_RING_MEMBER)->ring_member.seat, 0);
        CHECK_EQ(gauges(e).ring_members, 1);
        env_check_status(ring_rejoin(e, B, s.name, 1, 2), PROTO_STATUS_OK);
        env_check_status(ring_close(e, P, s.name), PROTO_STATUS_OK);

        /* The same through claims waiting for the ring. */
        CHECK(ring_rejoin(e, A, s.name, 0, 1)->m.pending);
        CHECK(ring_rejoin(e, A, s.name, 1, 2)->m.pending);
        env_check_status(ring_create(e, P, &spec), PROTO_STATUS_OK);
        CHECK_EQ(env_why(ring_event_to(e, A, PROTO_EV_MEMBER_LEFT, s.name, 1, 2), REG_E_RING_MEMBER)->ring_member.seat,
                 0);
        CHECK_EQ(gauges(e).ring_members, 1);
        env_free(e);
}

/* Fixed: seat claims were bounded only in all (waits per peer times connections), so one
 * connection could take them all; now each connection has its waits' limit. */
static void test_ring_seat_claims_quota(void)
{
        Limits limits = LIMITS_DEFAULT;
        Env *e;
        RegPeer *A, *B;
        Sent *r;

        limits.waits_per_peer = 2;
        limits.connections = 4;
        e = ring_env(&limits, 1000);
        A = peer(e, 1001);
        B = peer(e, 1001);
        CHECK(ring_rejoin(e, A, "r/1", 0, 1)->m.pending);
        CHECK(ring_rejoin(e, A, "r/2", 0, 1)->m.pending);
        r = ring_rejoin(e, A, "r/3", 0, 1);
        env_check_status(r, PROTO_STATUS_QUOTA);
        CHECK_EQ(env_why(r, REG_E_SEAT_CLAIMS_LIMIT)->seat_claims_limit.claims, 2);
        CHECK(ring_rejoin(e, B, "r/3", 0, 1)->m.pending);
        remove_peer(e, A);
        CHECK_EQ(e->r->n_seat_claims, 1);
        env_free(e);
}

int main(int argc, char **argv)
{
        TEST_RUN(argc, argv, test_ring_lifecycle_backpressure);
        TEST_RUN(argc, argv, test_ring_lifecycle_latest);
        TEST_RUN(argc, argv, test_ring_lifecycle_stream);
        TEST_RUN(argc, argv, test_ring_parts_backpressure);
        TEST_RUN(argc, argv, test_ring_parts_latest);
        TEST_RUN(argc, argv, test_ring_parts_stream);
        TEST_RUN(argc, argv, test_ring_stream_counters);
        TEST_RUN(argc, argv, test_ring_evict);
        TEST_RUN(argc, argv, test_ring_owner_disconnects);
        TEST_RUN(argc, argv, test_ring_member_disconnects);
        TEST_RUN(argc, argv, test_ring_quotas);
        TEST_RUN(argc, argv, test_ring_names);
        TEST_RUN(argc, argv, test_ring_part_freed);
        TEST_RUN(argc, argv, test_ring_restored);
        TEST_RUN(argc, argv, test_ring_seat_claims);
        TEST_RUN(argc, argv, test_ring_part_refuses_claims);
        TEST_RUN(argc, argv, test_ring_evict_reserved_seat);
        TEST_RUN(argc, argv, test_ring_restored_after_grace);
        TEST_RUN(argc, argv, test_ring_part_never_adopts);
        TEST_RUN(argc, argv, test_ring_one_seat_per_member);
        TEST_RUN(argc, argv, test_ring_seat_claims_quota);
        return TEST_END();
}
