/* Fuzz target: the registry driven by operation sequences.
 *
 * Each input byte stream is a program over four peer slots: add and remove peers, hello, publish
 * (memfd, cuda-vmm or cuda-legacy; broker-held or not; retire_after; metadata; real memfds),
 * publish again by id, publish under an id of the producer's choosing or restored after a restart
 * (live or retired, with a generation), reclaim (matching or not, before or after its producer
 * came back), attach by name (waiting) or id, release, retire, free, unmap, subscribe, unsubscribe,
 * group join, time passing (expire, and the end of the restart grace) and cancelling every wait;
 * and rings: create (backpressure, latest or stream; restored with seats), register a part (any
 * index, kind, size, writability, device, id; restored), register every missing part, join, take
 * a seat back (restored join, before or after the ring came back), leave, evict (current or stale
 * epoch), close, attach a part by id. Requests follow what broker/request.c lets through (valid
 * names, legacy never broker-held, group counts above 0, ring shapes in range).
 *
 * After every operation the outbox is decoded and checked (regenv.h: every frame decodes, every fd
 * borrowed by a frame is open and ours, every fd closed is closed once, gauges agree with the
 * views) and compared with a model kept here from the replies and events alone:
 *   - each request gets exactly one reply, now or (for waits) later;
 *   - references per peer and per buffer match what attach and release replies said, and revoked
 *     events arrive only for references held;
 *   - the fd travels with an attach exactly when the peer has no mapping (else "cached"), and a
 *     peer with a mapping hears "freed" when the buffer is forgotten;
 *   - drained events go to the buffer's owner, subscription events to the subscription's peer;
 *   - a reclaim succeeds exactly for the same, undrained publication, waits exactly when the id is
 *     unknown during the grace, and a waiting claim becomes references or a revoked event when its
 *     buffer is registered, and a revoked event when the grace ends;
 *   - pending waits, groups and names match the gauges; no deadline is left in the past;
 *   - every ring request gets the status the rules of docs/protocol.md 6.16 give; a join names
 *     exactly the seat's parts; member-joined and member-left events arrive exactly as the model
 *     expects (to whom, which ring, seat and epoch); an attach of a ring part succeeds only for a
 *     member of its ring, and a member page or counter only for its seat's member; a seat whose
 *     membership ended lets go of its page and counters (they stay the producer's buffers,
 *     attachable by nobody) and is not handed out until the producer registers new ones (a join
 *     meanwhile: not-found, unless no seat is free: quota); the registry's
 *     rings, parts and seats match the model, and its own books hold (regaudit.h: parts point back
 *     at their ring, seats at live peers, per-uid accounting adds up).
 * At the end every peer leaves, which must leave no ring, seat or claim and only broker-held
 * orphans; then the registry is freed and every fd it was given must be closed. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"

#define ENV_MAX_SENT 512
#define ENV_MAX_FDS 128
#include "regenv.h"
#include "regaudit.h"

#define SLOTS 4
#define MAX_PENDING 256
#define MAX_HOLDS 256
#define MAX_BUFS 64
#define MAX_SUBS 64
#define MAX_CLAIMS 64
#define GRACE_MS 2000
#define N_OPS 24
#define LIMIT_BUFFERS 10 /* per uid: a ring and its parts count */
#define LIMIT_FDS 8
#define LIMIT_WAITS 3 /* per peer: attach waits and group joins; seat claims apart */
#define N_RINGS 3
#define RING_SLOTS_MAX 5
#define RING_MEMBERS_MAX 3
#define RING_PARTS_MAX (1 + RING_SLOTS_MAX + 2 * RING_MEMBERS_MAX)
#define MAX_SEAT_CLAIMS 32
#define MAX_EXPECT 64

static const char *const names[] = { "a", "a/b", "a/c", "b", "frames/0", "frames/1", "c", "d" };
#define N_NAMES (sizeof(names) / sizeof(names[0]))
static const char *const prefixes[] = { "", "a", "a/", "b", "x" };
static const char *const groups[] = { "g1", "g2" };
static const char *const devices[] = { "GPU-a", "GPU-b" };
static const uint32_t timeouts[] = { 0, 1, 50, 1000, PROTO_TIMEOUT_INFINITE };
static const uint8_t handle[PROTO_LEGACY_HANDLE_SIZE] = { 7 };
static const uint8_t meta[] = { 0x81, 0xa5, 's', 'h', 'a', 'p', 'e', 0x92, 0x04, 0x04 };
/* Ring names are their own namespace: "a" is also a buffer name. */
static const char *const ring_names[N_RINGS] = { "r/0", "r/1", "a" };

enum { REQ_ATTACH, REQ_JOIN, REQ_OTHER };

typedef struct Pending {
        uint64_t id;
        RegPeer *peer;
        int type;
        int name;  /* attach waits: index into names */
        int group; /* joins: index into groups */
        bool waiting;
} Pending;

typedef struct HoldRec {
        RegPeer *peer;
        uint64_t buf;
        uint32_t refs;
        bool mapped;
} HoldRec;

typedef struct Buf {
        uint64_t id;
        RegPeer *owner; /* NULL once the producer is gone */
        ProtoKind kind;
} Buf;

typedef struct SubRec {
        RegPeer *peer;
        uint64_t id;
} SubRec;

/* A reclaim waiting for its buffer (the registry's Claim). */
typedef struct ClaimRec {
        RegPeer *peer;
        uint64_t buf, generation;
        uint32_t refs, uid;
        ProtoKind kind;
        const char *name;
        bool doomed; /* the registry must send it a revoked event in this batch */
        uint64_t seq; /* order of arrival: a release takes from the peer's oldest claim first */
} ClaimRec;

/* One seat of a ring: taken by peer, or reserved for a member coming back after the restart. */
typedef struct SeatRec {
        RegPeer *peer;
        uint64_t epoch;
        bool reserved;
} SeatRec;

typedef struct RingRec {
        bool exists;
        RegPeer *owner;
        ProtoMode mode;
        ProtoKind kind;
        uint32_t slots, members;
        const char *device;
        uint64_t next_epoch;
        bool set_up;                        /* every part was registered once */
        uint64_t parts[RING_PARTS_MAX];     /* buffer ids; 0: not registered (or let go of) */
        uint64_t let_go[RING_PARTS_MAX];    /* the last page or counters let go of at each index */
        SeatRec seats[RING_MEMBERS_MAX];
} RingRec;

/* A member asking for its seat back before its ring came back (the registry's SeatClaim). */
typedef struct SeatClaimRec {
        RegPeer *peer;
        int ring;
        uint32_t index;
        uint64_t epoch;
} SeatClaimRec;

/* A ring event the registry must send in this operation. */
typedef struct RingExpect {
        RegPeer *to;
        ProtoEvent ev;
        int ring;
        uint32_t seat;
        uint64_t epoch;
} RingExpect;

typedef struct Model {
        Env *e;
        RegPeer *slot[SLOTS];
        uint64_t next_id;
        Pending pending[MAX_PENDING];
        size_t n_pending;
        HoldRec holds[MAX_HOLDS];
        size_t n_holds;
        Buf bufs[MAX_BUFS];
        size_t n_bufs;
        SubRec subs[MAX_SUBS];
        size_t n_subs;
        ClaimRec claims[MAX_CLAIMS];
        size_t n_claims;
        uint64_t claim_seq;
        bool in_grace;
        RingRec rings[N_RINGS];
        SeatClaimRec seat_claims[MAX_SEAT_CLAIMS]; /* in order of arrival, as the registry settles them */
        size_t n_seat_claims;
        RingExpect expect[MAX_EXPECT];
        size_t n_expect;
} Model;

typedef struct Input {
        const uint8_t *p, *end;
} Input;

static uint8_t take(Input *in)
{
        return in->p < in->end ? *in->p++ : 0;
}

/* ---- model bookkeeping ---- */

static HoldRec *hold_find(Model *M, RegPeer *p, uint64_t buf)
{
        for (size_t i = 0; i < M->n_holds; i++)
                if (M->holds[i].peer == p && M->holds[i].buf == buf)
                        return &M->holds[i];
        return NULL;
}

static HoldRec *hold_get(Model *M, RegPeer *p, uint64_t buf)
{
        HoldRec *h = hold_find(M, p, buf);

        if (h)
                return h;
        CHECK(M->n_holds < MAX_HOLDS);
        M->holds[M->n_holds] = (HoldRec){ p, buf, 0, false };
        return &M->holds[M->n_holds++];
}

static Buf *buf_find(Model *M, uint64_t id)
{
        for (size_t i = 0; i < M->n_bufs; i++)
                if (M->bufs[i].id == id)
                        return &M->bufs[i];
        return NULL;
}

static Pending *pending_add(Model *M, RegPeer *p, int type)
{
        Pending *q;

        CHECK(M->n_pending < MAX_PENDING);
        q = &M->pending[M->n_pending++];
        *q = (Pending){ .id = ++M->next_id, .peer = p, .type = type, .name = -1, .group = -1 };
        return q;
}

/* The pending request a reply answers; it is answered once. */
static Pending pending_take(Model *M, RegPeer *to, uint64_t id)
{
        for (size_t i = 0; i < M->n_pending; i++) {
                if (M->pending[i].id == id) {
                        Pending q = M->pending[i];
                        CHECK(q.peer == to);
                        M->pending[i] = M->pending[--M->n_pending];
                        return q;
                }
        }
        fprintf(stderr, "reply %llu answers no pending request\n", (unsigned long long)id);
        CHECK(!"unexpected reply");
        return (Pending){ 0 };
}

static bool claim_doomed(const Model *M, RegPeer *p, uint64_t buf)
{
        for (size_t i = 0; i < M->n_claims; i++)
                if (M->claims[i].peer == p && M->claims[i].buf == buf && M->claims[i].doomed)
                        return true;
        return false;
}

/* The revoked event a doomed claim was owed: takes the claim out of the model. */
static bool claim_doomed_take(Model *M, RegPeer *p, uint64_t buf)
{
        for (size_t i = 0; i < M->n_claims; i++) {
                if (M->claims[i].peer == p && M->claims[i].buf == buf && M->claims[i].doomed) {
                        M->claims[i] = M->claims[--M->n_claims];
                        return true;
                }
        }
        return false;
}

/* Would the registry take a reclaim of (generation, uid, kind, name) for rb? (registry-claims.c; a
 * ring's part is taken back by joining the ring, never reclaimed) */
static bool claim_matches(RegBuffer *rb, uint64_t generation, uint32_t uid, ProtoKind kind, const char *name)
{
        ProtoMsg d;

        reply_buffer_describe(rb, &d);
        return d.generation == generation && d.uid == uid && d.kind == kind && proto_str_eq(d.name, name) &&
               d.state != PROTO_STATE_IDLE && !registry_buffer_ring_part(rb);
}

static void add_refs_of(const RegPeer *q, uint32_t refs, void *ud)
{
        struct { const RegPeer *p; uint64_t refs; } *want = ud;

        if (q == want->p)
                want->refs += refs;
}

/* The references the registry counts for p on rb. */
static uint64_t registry_refs_of(RegBuffer *rb, const RegPeer *p)
{
        struct { const RegPeer *p; uint64_t refs; } want = { p, 0 };

        registry_buffer_holders(rb, add_refs_of, &want);
        return want.refs;
}

/* A buffer was registered under id: the model's claims for it become references or are doomed. */
static void claims_meet(Model *M, uint64_t id)
{
        RegBuffer *rb = registry_buffer_by_id(M->e->r, id);

        for (size_t i = 0; i < M->n_claims;) {
                ClaimRec *c = &M->claims[i];

                if (c->buf != id || c->doomed) {
                        i++;
                        continue;
                }
                CHECK(rb);
                /* A matching claim is still judged like a reclaim (the attach's checks, retire_after):
                 * it became references only if the registry's count for its peer says so. */
                if (claim_matches(rb, c->generation, c->uid, c->kind, c->name) &&
                    (hold_find(M, c->peer, id) ? hold_find(M, c->peer, id)->refs : 0) + c->refs <=
                            registry_refs_of(rb, c->peer)) {
                        HoldRec *h = hold_get(M, c->peer, id);
                        h->refs += c->refs;
                        h->mapped |= c->kind != PROTO_KIND_CUDA_LEGACY;
                        *c = M->claims[--M->n_claims];
                        continue;
                }
                c->doomed = true;
                i++;
        }
}

static bool sub_owned(const Model *M, RegPeer *p, uint64_t sub)
{
        for (size_t i = 0; i < M->n_subs; i++)
                if (M->subs[i].peer == p && M->subs[i].id == sub)
                        return true;
        return false;
}

/* ---- the ring model ---- */

static uint32_t ring_parts_of(const RingRec *R)
{
        return 1 + R->slots + R->members * (R->mode == PROTO_MODE_STREAM ? 2 : 1);
}

static uint32_t ring_page(const RingRec *R, uint32_t seat)
{
        return 1 + R->slots + seat;
}

static uint32_t ring_counter(const RingRec *R, uint32_t seat)
{
        return 1 + R->slots + R->members + seat;
}

static int ring_seat_of(const RingRec *R, const RegPeer *p)
{
        for (uint32_t i = 0; R->exists && i < R->members; i++)
                if (R->seats[i].peer == p)
                        return (int)i;
        return -1;
}

/* May p attach part i of R? Every member the control page and the slots, a member page and
 * counters only their seat's member. */
static bool ring_may_attach(const RingRec *R, const RegPeer *p, uint32_t i)
{
        int seat = ring_seat_of(R, p);

        return seat >= 0 && (i <= R->slots || i == ring_page(R, (uint32_t)seat) ||
                             (R->mode == PROTO_MODE_STREAM && i == ring_counter(R, (uint32_t)seat)));
}

static void expect_ring_event(Model *M, RegPeer *to, ProtoEvent ev, int ring, uint32_t seat, uint64_t epoch)
{
        CHECK(M->n_expect < MAX_EXPECT);
        M->expect[M->n_expect++] = (RingExpect){ to, ev, ring, seat, epoch };
}

/* A membership of seat i ended: its page (and a stream ring's counters) are the ring's no more.
 * They stay buffers of the producer that nobody may attach; the seat waits for new ones. */
static void seat_let_go(RingRec *R, uint32_t i)
{
        uint32_t idx[2] = { ring_page(R, i), ring_counter(R, i) };

        for (uint32_t k = 0; k < (R->mode == PROTO_MODE_STREAM ? 2u : 1u); k++) {
                if (R->parts[idx[k]])
                        R->let_go[idx[k]] = R->parts[idx[k]];
                R->parts[idx[k]] = 0;
        }
}

/* Has seat i the parts a join hands out? */
static bool seat_has_parts(const RingRec *R, uint32_t i)
{
        return R->parts[ring_page(R, i)] && (R->mode != PROTO_MODE_STREAM || R->parts[ring_counter(R, i)]);
}

/* Seat i of ring ri is emptied: the producer hears member-left, the member too when told (a
 * reserved seat has no member yet); either way its parts are let go of. */
static void seat_vacate(Model *M, int ri, uint32_t i, bool tell_member)
{
        RingRec *R = &M->rings[ri];
        SeatRec *st = &R->seats[i];

        if (st->reserved) {
                expect_ring_event(M, R->owner, PROTO_EV_MEMBER_LEFT, ri, i, st->epoch);
                st->reserved = false;
                seat_let_go(R, i);
                return;
        }
        if (!st->peer)
                return;
        expect_ring_event(M, R->owner, PROTO_EV_MEMBER_LEFT, ri, i, st->epoch);
        if (tell_member)
                expect_ring_event(M, st->peer, PROTO_EV_MEMBER_LEFT, ri, i, st->epoch);
        st->peer = NULL;
        seat_let_go(R, i);
}

/* Ring ri is gone (closed, or its producer left): its members hear it, its producer does not. */
static void ring_forget(Model *M, int ri)
{
        RingRec *R = &M->rings[ri];

        for (uint32_t i = 0; i < R->members; i++)
                if (R->seats[i].peer)
                        expect_ring_event(M, R->seats[i].peer, PROTO_EV_MEMBER_LEFT, ri, i, R->seats[i].epoch);
        memset(R, 0, sizeof(*R));
}

/* The restart grace is over for ring ri: seats still waiting for their members are given up. */
static void ring_unreserve(Model *M, int ri)
{
        for (uint32_t i = 0; M->rings[ri].exists && i < M->rings[ri].members; i++)
                if (M->rings[ri].seats[i].reserved)
                        seat_vacate(M, ri, i, false);
}

static void seat_claim_drop(Model *M, size_t i)
{
        memmove(&M->seat_claims[i], &M->seat_claims[i + 1], (M->n_seat_claims - i - 1) * sizeof(M->seat_claims[0]));
        M->n_seat_claims--;
}

static size_t seat_claims_of(const Model *M, const RegPeer *p)
{
        size_t n = 0;

        for (size_t i = 0; i < M->n_seat_claims; i++)
                n += M->seat_claims[i].peer == p;
        return n;
}

static int ring_by_name(ProtoStr name)
{
        for (int i = 0; i < N_RINGS; i++)
                if (proto_str_eq(name, ring_names[i]))
                        return i;
        return -1;
}

/* A ring event: it must be one the model expects (each once). */
static void ring_event_take(Model *M, const Sent *s)
{
        const ProtoMsg *m = &s->m;
        int ri = ring_by_name(m->name);

        CHECK(ri >= 0);
        CHECK(proto_has(m, PF_INDEX) && proto_has(m, PF_GENERATION) && !proto_has(m, PF_BUFFER));
        CHECK_EQ(proto_has(m, PF_REASON), m->event == PROTO_EV_MEMBER_LEFT);
        for (size_t i = 0; i < M->n_expect; i++) {
                RingExpect *x = &M->expect[i];

                if (x->to == s->to && x->ev == m->event && x->ring == ri && x->seat == m->index &&
                    x->epoch == m->generation) {
                        *x = M->expect[--M->n_expect];
                        return;
                }
        }
        fprintf(stderr, "unexpected %s about ring '%s' seat %llu epoch %llu to peer %llu\n",
                proto_event_name(m->event), ring_names[ri], (unsigned long long)m->index,
                (unsigned long long)m->generation, (unsigned long long)registry_peer_id(s->to));
        CHECK(!"unexpected ring event");
}

/* An attach of a ring's part succeeded: the peer must be a member, and of the part's seat (a part
 * of no ring in the model, closed or let go of, is nobody's). */
static void check_part_attach(Model *M, RegPeer *p, uint64_t buffer)
{
        RegBuffer *rb = registry_buffer_by_id(M->e->r, buffer);

        if (!rb || !registry_buffer_ring_part(rb))
                return;
        for (int ri = 0; ri < N_RINGS; ri++)
                for (uint32_t i = 0; M->rings[ri].exists && i < ring_parts_of(&M->rings[ri]); i++)
                        if (M->rings[ri].parts[i] == buffer) {
                                CHECK(ring_may_attach(&M->rings[ri], p, i));
                                return;
                        }
        CHECK(!"a part of a closed ring was attached");
}

/* Reads what one operation sent and updates the model. */
static void absorb(Model *M)
{
        Env *e = M->e;

        for (size_t i = 0; i < e->n_sent; i++) {
                Sent *s = &e->sent[i];
                const ProtoMsg *m = &s->m;

                if (m->type == PROTO_REPLY) {
                        Pending q = pending_take(M, s->to, m->reply);

                        if (q.type == REQ_ATTACH && m->status == PROTO_STATUS_OK) {
                                HoldRec *h = hold_get(M, s->to, m->buffer);
                                Buf *b = buf_find(M, m->buffer);

                                CHECK(b);
                                CHECK(proto_has(m, PF_CACHED));
                                if (b->kind == PROTO_KIND_CUDA_LEGACY) {
                                        CHECK(!m->cached && s->fd < 0);
                                        CHECK(proto_has(m, PF_HANDLE));
                                } else {
                                        /* The fd travels exactly when the peer has no mapping. */
                                        CHECK_EQ(m->cached, h->mapped);
                                        CHECK_EQ(s->fd >= 0, !h->mapped);
                                        h->mapped = true;
                                }
                                h->refs++;
                                check_part_attach(M, s->to, m->buffer);
                        }
                        continue;
                }
                CHECK_EQ(m->type, PROTO_EVENT);
                if (m->event == PROTO_EV_MEMBER_JOINED || m->event == PROTO_EV_MEMBER_LEFT) {
                        ring_event_take(M, s);
                        continue;
                }
                CHECK(buf_find(M, m->buffer) || (m->event == PROTO_EV_REVOKED && claim_doomed(M, s->to, m->buffer)));
                if (proto_has(m, PF_SUB)) {
                        CHECK(sub_owned(M, s->to, m->sub));
                        continue;
                }
                switch (m->event) {
                case PROTO_EV_DRAINED:
                        CHECK(buf_find(M, m->buffer)->owner == s->to);
                        break;
                case PROTO_EV_REVOKED: {
                        HoldRec *h = hold_find(M, s->to, m->buffer);

                        CHECK(proto_has(m, PF_REASON));
                        if (claim_doomed_take(M, s->to, m->buffer))
                                break;
                        CHECK(h && h->refs > 0);
                        h->refs = 0;
                        break;
                }
                case PROTO_EV_FREED: {
                        HoldRec *h = hold_find(M, s->to, m->buffer);
                        CHECK(h && h->mapped);
                        h->mapped = false;
                        break;
                }
                default:
                        CHECK(!"unexpected event");
                }
        }
        /* Every ring event the model expected came. */
        for (size_t i = 0; i < M->n_expect; i++)
                fprintf(stderr, "missing %s about ring '%s' seat %u epoch %llu to peer %llu\n",
                        proto_event_name(M->expect[i].ev), ring_names[M->expect[i].ring], M->expect[i].seat,
                        (unsigned long long)M->expect[i].epoch, (unsigned long long)registry_peer_id(M->expect[i].to));
        CHECK_EQ(M->n_expect, 0);
}

/* The registry's rings against the model: shape, owner, parts (forgetting parts the registry
 * destroyed, which only a free or a drain does: the model lets go of a seat's parts itself), seats
 * and epochs. */
static void compare_rings(Model *M)
{
        Registry *r = M->e->r;

        for (int ri = 0; ri < N_RINGS; ri++) {
                RingRec *R = &M->rings[ri];
                RegRing *g = registry_ring_by_name(r, ring_names[ri]);

                CHECK_EQ(g != NULL, R->exists);
                if (!g)
                        continue;
                CHECK(g->owner == R->owner);
                CHECK_EQ(g->mode, R->mode);
                CHECK_EQ(g->n_slots, R->slots);
                CHECK_EQ(g->n_members, R->members);
                CHECK_EQ(g->next_epoch, R->next_epoch);
                CHECK_EQ(g->set_up, R->set_up);
                for (uint32_t i = 0; i < ring_parts_of(R); i++) {
                        if (!g->parts[i] && R->parts[i]) {
                                CHECK(!registry_buffer_by_id(r, R->parts[i]));
                                R->parts[i] = 0;
                        }
                        CHECK_EQ(g->parts[i] ? g->parts[i]->id : 0, R->parts[i]);
                }
                for (uint32_t i = 0; i < R->members; i++) {
                        CHECK(g->seats[i].peer == R->seats[i].peer);
                        CHECK_EQ(g->seats[i].reserved, R->seats[i].reserved);
                        if (R->seats[i].peer || R->seats[i].reserved)
                                CHECK_EQ(g->seats[i].epoch, R->seats[i].epoch);
                }
        }
        CHECK_EQ(r->n_seat_claims, M->n_seat_claims);
        audit_registry(r);
}

/* Ring parts live under no name (the names gauge does not count them). */
static uint64_t unnamed_parts(const Registry *r)
{
        uint64_t n = 0;

        for (RegBuffer *b = registry_buffer_after(r, 0); b; b = registry_buffer_next(r, b))
                n += b->ring_part && b->state == PROTO_STATE_LIVE && !b->published;
        return n;
}

/* Compares the model with the registry after an operation. */
static void compare(Model *M)
{
        Registry *r = M->e->r;
        RegGauges g;
        uint64_t waits = 0;
        bool group_seen[2] = { false, false }, name_seen[N_NAMES] = { false };
        uint64_t names_waiting = 0;

        registry_gauges(r, &g);
        for (size_t i = 0; i < M->n_holds;)
                if (!M->holds[i].refs && !M->holds[i].mapped)
                        M->holds[i] = M->holds[--M->n_holds];
                else
                        i++;
        for (size_t i = 0; i < M->n_pending; i++) {
                Pending *q = &M->pending[i];

                /* Only waits outlive their operation. */
                CHECK(q->waiting);
                waits++;
                if (q->type == REQ_JOIN)
                        group_seen[q->group] = true;
                if (q->type == REQ_ATTACH && !name_seen[q->name]) {
                        name_seen[q->name] = true;
                        names_waiting += registry_buffer_by_name(r, names[q->name]) == NULL;
                }
        }
        CHECK_EQ(g.waits, waits);
        CHECK_EQ(g.groups, (uint64_t)group_seen[0] + group_seen[1]);
        CHECK_EQ(g.names, g.live - unnamed_parts(r) + names_waiting);
        CHECK(registry_next_deadline(r) > M->e->now);
        if (!waits && !M->in_grace)
                CHECK_EQ(registry_next_deadline(r), UINT64_MAX);
        CHECK_EQ(registry_in_grace(r), M->in_grace);
        CHECK_EQ(g.claims_pending, M->n_claims);
        for (size_t i = 0; i < M->n_claims; i++)
                CHECK(!M->claims[i].doomed); /* every doomed claim got its revoked event */

        for (RegPeer *p = registry_peer_first(r); p; p = registry_peer_next(r, p)) {
                ProtoMsg d;
                uint64_t refs = 0;

                reply_peer_describe(p, &d);
                for (size_t i = 0; i < M->n_holds; i++)
                        if (M->holds[i].peer == p)
                                refs += M->holds[i].refs;
                CHECK_EQ(d.refs, refs);
        }
        for (size_t i = 0; i < M->n_bufs; i++) {
                Buf *b = &M->bufs[i];
                RegBuffer *rb = registry_buffer_by_id(r, b->id);
                uint64_t refs = 0;
                bool mapped = false;

                for (size_t k = 0; k < M->n_holds; k++) {
                        if (M->holds[k].buf == b->id) {
                                refs += M->holds[k].refs;
                                mapped |= M->holds[k].mapped;
                        }
                }
                if (rb) {
                        ProtoMsg d;

                        reply_buffer_describe(rb, &d);
                        CHECK_EQ(d.refs, refs);
                        CHECK_EQ(d.owner, b->owner ? registry_peer_id(b->owner) : 0);
                } else {
                        /* Forgotten: nobody holds it, and everyone who mapped it was told. */
                        CHECK_EQ(refs, 0);
                        CHECK(!mapped);
                }
        }
        compare_rings(M);
}

/* ---- operations ---- */

static RegPeer *peer_at(Model *M, uint8_t b)
{
        return M->slot[b % SLOTS];
}

/* A buffer id the model knows, or one a claim waits for, or (the last choice) one that never
 * existed. */
static uint64_t pick_buffer(Model *M, uint8_t b)
{
        size_t i = b % (M->n_bufs + M->n_claims + 1);

        if (i < M->n_bufs)
                return M->bufs[i].id;
        if (i < M->n_bufs + M->n_claims)
                return M->claims[i - M->n_bufs].buf;
        return 1000000u + b;
}

static void op_add(Model *M, Input *in)
{
        static const uint32_t uids[] = { 1000, 1000, 1001, 0 };
        uint8_t s = take(in) % SLOTS, c = take(in);
        PeerCreds creds = { .uid = uids[c % 4], .gid = c % 4, .pid = c & 4 ? 0 : 100u + s,
                            .pidns = (c >> 3) % 3, .self_pid = c & 4 ? 0 : 1u + (c >> 5) % 2 };
        RegPeer *p = NULL;
        int r;

        if (M->slot[s])
                return;
        r = registry_peer_add(M->e->r, &creds, M->e->now, NULL, &p, NULL);
        if (r > 0) /* a limit: too many connections, or no room in the memory budget */
                return;
        CHECK_EQ(r, 0);
        M->slot[s] = p;
}

/* What p's departure does to rings: its claims go silently, its seats are freed (their producers
 * hear it), its rings are destroyed (their members hear it). */
static void rings_drop_peer(Model *M, RegPeer *p)
{
        for (size_t i = 0; i < M->n_seat_claims;)
                if (M->seat_claims[i].peer == p)
                        seat_claim_drop(M, i);
                else
                        i++;
        for (int ri = 0; ri < N_RINGS; ri++) {
                int seat = ring_seat_of(&M->rings[ri], p);

                if (seat >= 0)
                        seat_vacate(M, ri, (uint32_t)seat, false);
        }
        for (int ri = 0; ri < N_RINGS; ri++)
                if (M->rings[ri].exists && M->rings[ri].owner == p)
                        ring_forget(M, ri);
}

/* Takes peer slot s out of the registry and the model (without flushing the outbox). */
static void remove_one(Model *M, unsigned s)
{
        RegPeer *p = M->slot[s];

        rings_drop_peer(M, p);
        registry_peer_remove(M->e->r, p, &M->e->sink);
        M->slot[s] = NULL;
        /* Forget it before reading what its departure caused: nothing may be addressed to it. */
        for (size_t i = 0; i < M->n_pending;)
                if (M->pending[i].peer == p)
                        M->pending[i] = M->pending[--M->n_pending];
                else
                        i++;
        for (size_t i = 0; i < M->n_holds;)
                if (M->holds[i].peer == p)
                        M->holds[i] = M->holds[--M->n_holds];
                else
                        i++;
        for (size_t i = 0; i < M->n_subs;)
                if (M->subs[i].peer == p)
                        M->subs[i] = M->subs[--M->n_subs];
                else
                        i++;
        for (size_t i = 0; i < M->n_claims;)
                if (M->claims[i].peer == p)
                        M->claims[i] = M->claims[--M->n_claims];
                else
                        i++;
        for (size_t i = 0; i < M->n_bufs; i++)
                if (M->bufs[i].owner == p)
                        M->bufs[i].owner = NULL;
        for (size_t i = 0; i < M->n_expect;)
                if (M->expect[i].to == p)
                        M->expect[i] = M->expect[--M->n_expect];
                else
                        i++;
        /* Nothing may stay addressed to it, not even frames queued before it left. */
        for (size_t i = 0; i < M->e->out.n_frames; i++)
                CHECK(M->e->out.frames[i].to != p);
}

/* One peer leaves, or (with the high bit) two in one batch, as when the broker stops. */
static void op_remove(Model *M, Input *in)
{
        uint8_t b = take(in);
        unsigned s = b % SLOTS, s2 = (b >> 2) % SLOTS;

        if (!M->slot[s])
                return;
        remove_one(M, s);
        if ((b & 0x80) && M->slot[s2])
                remove_one(M, s2);
        env_flush(M->e);
        absorb(M);
}

static void op_hello(Model *M, Input *in)
{
        RegPeer *p = peer_at(M, take(in));
        uint8_t c = take(in);
        const char *gpus[2] = { devices[0], devices[1] };
        PeerHello h = { .pid = c, .pidns = (c >> 2) % 3, .label = "fuzz", .n_gpus = c % 3,
                        .gpus = c & 8 ? gpus + 1 : gpus };

        if (!p)
                return;
        if (h.n_gpus == 2 && (c & 8))
                h.n_gpus = 1;
        if (registry_peer_said_hello(p))
                CHECK_EQ(registry_peer_hello(M->e->r, p, &h, NULL), REG_E_HELLO_AGAIN);
        else
                CHECK_EQ(registry_peer_hello(M->e->r, p, &h, NULL), 0);
}

static uint64_t generation_of(RegBuffer *rb)
{
        ProtoMsg d;

        reply_buffer_describe(rb, &d);
        return d.generation;
}

/* The id a publish of new memory names: the broker's pick, a fresh one, one the model knows
 * (registered: taken, or an orphan to adopt; forgotten: free again), or one a claim waits for. */
static uint64_t pick_new_id(Model *M, uint8_t k)
{
        switch (k & 3) {
        case 0: return 0;
        case 1: return 2000000u + (k >> 2);
        case 2: return pick_buffer(M, k >> 2);
        default: return M->n_claims ? M->claims[(k >> 2) % M->n_claims].buf : 0;
        }
}

/* A publish the broker's request layer would let through. */
static void op_publish(Model *M, Input *in, bool again)
{
        RegPeer *p = peer_at(M, take(in));
        uint8_t n = take(in), f = take(in), d = take(in), k = again ? 0 : take(in);
        RegPublish a = { 0 };
        RegBuffer *rb;
        Pending *q;
        Sent *s;

        if (!p || M->e->n_fds >= ENV_MAX_FDS - 1 || M->n_bufs >= MAX_BUFS)
                return;
        a.name = names[n % N_NAMES];
        a.info.kind = 1 + (f & 3) % 3;
        a.info.size = 4096;
        a.device = a.info.kind == PROTO_KIND_MEMFD ? NULL : devices[d % 2];
        a.handle = a.info.kind == PROTO_KIND_CUDA_LEGACY ? handle : NULL;
        a.info.broker_held = a.info.kind != PROTO_KIND_CUDA_LEGACY && (f & 4);
        a.retire_after = (f >> 3) % 4;
        a.info.writable = true;
        if (f & 0x20) {
                a.meta = meta;
                a.meta_len = sizeof(meta);
                a.has_meta = true;
        } else {
                a.has_meta = again && (f & 0x40);
        }
        a.fd = -1;
        a.again = again;
        if (again) {
                a.buffer = pick_buffer(M, d);
                if (f & 0x80) /* the request layer refuses this; the registry must still close it */
                        a.fd = env_memfd(M->e, 4096);
        } else {
                a.buffer = pick_new_id(M, k);
                if (k & 0x10) {
                        /* Registered again after a restart: the generation it had (often one a
                         * claim or the registry knows, so that matches happen). */
                        rb = a.buffer ? registry_buffer_by_id(M->e->r, a.buffer) : NULL;
                        a.restored = true;
                        a.retired = k & 0x20;
                        a.generation = (k & 0x40) && rb ? generation_of(rb) : 1u + (k >> 7);
                        for (size_t i = 0; i < M->n_claims && !(k & 0x40); i++)
                                if (M->claims[i].buf == a.buffer)
                                        a.generation = M->claims[i].generation;
                }
                if (a.info.kind != PROTO_KIND_CUDA_LEGACY)
                        a.fd = env_memfd(M->e, 4096);
        }
        q = pending_add(M, p, REQ_OTHER);
        ENV_DO(M->e, p, q->id, registry_publish, &a);
        CHECK_EQ(a.fd, -1);
        env_flush(M->e);
        s = env_reply(M->e, p, q->id);
        if (s->m.status == PROTO_STATUS_OK) {
                Buf *b = buf_find(M, s->m.buffer);

                CHECK(!again || s->m.buffer == a.buffer);
                CHECK(!a.buffer || s->m.buffer == a.buffer);
                CHECK(proto_has(&s->m, PF_STATE));
                if (!b) {
                        CHECK(!again);
                        b = &M->bufs[M->n_bufs++];
                }
                if (!again) /* new, an id used again after its buffer was forgotten, or adopted */
                        *b = (Buf){ s->m.buffer, p, registry_buffer_by_id(M->e->r, s->m.buffer) ? a.info.kind : 0 };
                if (!again && registry_buffer_by_id(M->e->r, s->m.buffer)) {
                        ProtoMsg dd;
                        reply_buffer_describe(registry_buffer_by_id(M->e->r, s->m.buffer), &dd);
                        b->kind = dd.kind;
                }
                CHECK(b->owner == p);
                if (!again)
                        claims_meet(M, s->m.buffer);
        } else if (!again && a.buffer && s->m.status == PROTO_STATUS_KEY_TAKEN) {
                CHECK(registry_buffer_by_id(M->e->r, a.buffer));
        }
        absorb(M);
}

/* A reconnecting consumer's reclaim: of a buffer the registry has (matching or not) or of one it
 * does not know yet. */
static void op_reclaim(Model *M, Input *in)
{
        static const uint32_t uids[] = { 1000, 1001, 0, 7 };
        RegPeer *p = peer_at(M, take(in));
        uint8_t b = take(in), f = take(in);
        RegReclaim a = { 0 };
        uint64_t refs_now = 0;
        RegBuffer *rb;
        ProtoMsg d = { 0 };
        Pending *q;
        Sent *s;

        if (!p || M->n_claims >= MAX_CLAIMS)
                return;
        a.buffer = (f & 0x80) ? 3000000u + (b & 7) : pick_buffer(M, b);
        rb = registry_buffer_by_id(M->e->r, a.buffer);
        if (rb)
                reply_buffer_describe(rb, &d);
        a.generation = rb && !(f & 1) ? d.generation : 1u + ((f >> 1) & 3);
        a.owner_uid = rb && !(f & 8) ? (uint32_t)d.uid : uids[(f >> 4) & 3];
        a.kind = rb && !(f & 16) ? d.kind : (ProtoKind)(1 + ((f >> 5) % 3));
        a.name = rb && !(f & 32) ? registry_buffer_name(rb) : names[b % N_NAMES];
        a.refs = 1 + (f >> 6);
        for (size_t i = 0; i < M->n_holds; i++)
                if (M->holds[i].peer == p)
                        refs_now += M->holds[i].refs;
        for (size_t i = 0; i < M->n_claims; i++)
                if (M->claims[i].peer == p)
                        refs_now += M->claims[i].refs;
        q = pending_add(M, p, REQ_OTHER);
        ENV_DO(M->e, p, q->id, registry_reclaim, &a);
        env_flush(M->e);
        s = env_reply(M->e, p, q->id);
        if (refs_now + a.refs > 6) { /* the fuzzer's refs_per_peer */
                CHECK_EQ(s->m.status, PROTO_STATUS_QUOTA);
        } else if (rb) {
                bool match = claim_matches(rb, a.generation, a.owner_uid, a.kind, a.name);

                /* Even the very publication is only granted what the claimant provably held or an
                 * attach would give (docs/protocol.md 6.15): the attach's checks may refuse it, and
                 * references nobody vouches for must fit a live buffer's retire_after. */
                if (!match)
                        CHECK_EQ(s->m.status, PROTO_STATUS_REVOKED);
                else if (s->m.status != PROTO_STATUS_OK)
                        CHECK(s->m.status == PROTO_STATUS_REVOKED || s->m.status == PROTO_STATUS_DEVICE ||
                              s->m.status == PROTO_STATUS_SAME_PID);
                if (match && s->m.status == PROTO_STATUS_OK) {
                        HoldRec *h = hold_get(M, p, a.buffer);
                        CHECK(!proto_has(&s->m, PF_PENDING));
                        h->refs += a.refs;
                        h->mapped |= d.kind != PROTO_KIND_CUDA_LEGACY;
                }
        } else if (M->in_grace) {
                CHECK_EQ(s->m.status, PROTO_STATUS_OK);
                CHECK(proto_has(&s->m, PF_PENDING) && s->m.pending);
                M->claims[M->n_claims++] = (ClaimRec){ p, a.buffer, a.generation, a.refs, a.owner_uid, a.kind,
                                                       a.name, false, ++M->claim_seq };
        } else {
                CHECK_EQ(s->m.status, PROTO_STATUS_REVOKED);
        }
        absorb(M);
}

static void op_attach(Model *M, Input *in, bool by_id)
{
        RegPeer *p = peer_at(M, take(in));
        uint8_t n = take(in), t = take(in);
        Pending *q;

        if (!p)
                return;
        q = pending_add(M, p, REQ_ATTACH);
        q->name = n % N_NAMES;
        if (by_id)
                ENV_DO(M->e, p, q->id, registry_attach, q->id, NULL, pick_buffer(M, n), 0, M->e->now);
        else
                ENV_DO(M->e, p, q->id, registry_attach, q->id, names[n % N_NAMES], 0, timeouts[t % 5], M->e->now);
        env_flush(M->e);
        if (!env_has_reply(M->e, p, q->id)) {
                CHECK(!by_id && timeouts[t % 5] > 0);
                q->waiting = true;
        }
        absorb(M);
}

static void op_buffer(Model *M, Input *in, int which)
{
        RegPeer *p = peer_at(M, take(in));
        uint8_t b = take(in), flags = take(in);
        uint64_t buf = pick_buffer(M, b);
        Pending *q;
        Sent *s;

        if (!p)
                return;
        q = pending_add(M, p, REQ_OTHER);
        switch (which) {
        case 0:
                ENV_DO(M->e, p, q->id, registry_release, buf);
                break;
        case 1:
                ENV_DO(M->e, p, q->id, registry_retire, buf, flags & 1);
                break;
        case 2:
                ENV_DO(M->e, p, q->id, registry_free_buffer, buf, flags & 1);
                break;
        default:
                ENV_DO(M->e, p, q->id, registry_unmap, buf);
                break;
        }
        env_flush(M->e);
        s = env_reply(M->e, p, q->id);
        if (which == 0) {
                HoldRec *h = hold_find(M, p, buf);
                ClaimRec *c = NULL;

                for (size_t i = 0; i < M->n_claims; i++)
                        if (M->claims[i].peer == p && M->claims[i].buf == buf && (!c || M->claims[i].seq < c->seq))
                                c = &M->claims[i];
                /* Release succeeds exactly when the model says a reference is held, or claimed. */
                CHECK_EQ(s->m.status == PROTO_STATUS_OK, (h && h->refs > 0) || c);
                if (s->m.status != PROTO_STATUS_OK)
                        CHECK_EQ(s->m.status, PROTO_STATUS_NOT_ATTACHED);
                else if (h && h->refs > 0)
                        h->refs--;
                else if (--c->refs == 0)
                        *c = M->claims[--M->n_claims];
        } else if (which == 3) {
                HoldRec *h = hold_find(M, p, buf);
                CHECK_EQ(s->m.status, PROTO_STATUS_OK);
                if (h)
                        h->mapped = false;
        }
        absorb(M);
}

static void op_subscribe(Model *M, Input *in, bool unsub)
{
        RegPeer *p = peer_at(M, take(in));
        uint8_t x = take(in);
        Pending *q;
        Sent *s;

        if (!p)
                return;
        q = pending_add(M, p, REQ_OTHER);
        if (unsub) {
                uint64_t sub = M->n_subs && x < 200 ? M->subs[x % M->n_subs].id : 777777;
                bool mine = sub_owned(M, p, sub);

                ENV_DO(M->e, p, q->id, registry_unsubscribe, sub);
                env_flush(M->e);
                s = env_reply(M->e, p, q->id);
                CHECK_EQ(s->m.status == PROTO_STATUS_OK, mine);
                for (size_t i = 0; mine && i < M->n_subs; i++)
                        if (M->subs[i].id == sub)
                                M->subs[i] = M->subs[--M->n_subs];
        } else {
                ENV_DO(M->e, p, q->id, registry_subscribe, prefixes[x % 5]);
                env_flush(M->e);
                s = env_reply(M->e, p, q->id);
                if (s->m.status == PROTO_STATUS_OK) {
                        CHECK(M->n_subs < MAX_SUBS);
                        M->subs[M->n_subs++] = (SubRec){ p, s->m.sub };
                }
        }
        absorb(M);
}

static void op_join(Model *M, Input *in)
{
        RegPeer *p = peer_at(M, take(in));
        uint8_t g = take(in), t = take(in);
        Pending *q;

        if (!p)
                return;
        q = pending_add(M, p, REQ_JOIN);
        q->group = g % 2;
        ENV_DO(M->e, p, q->id, registry_group_join, q->id, groups[g % 2], 1 + (g >> 1) % 4, 1 + t * 7u, M->e->now);
        env_flush(M->e);
        if (!env_has_reply(M->e, p, q->id))
                q->waiting = true;
        absorb(M);
}

static void op_time(Model *M, Input *in)
{
        uint8_t t = take(in);

        if (t == 0xff) {
                registry_cancel_waits(M->e->r, &M->e->sink);
                env_flush(M->e);
                for (size_t i = 0; i < M->e->n_sent; i++)
                        CHECK_EQ(M->e->sent[i].m.status, PROTO_STATUS_SHUTDOWN);
                absorb(M);
                return;
        }
        M->e->now += (uint64_t)t * 10;
        /* The end of the restart grace: every claim still waiting is revoked, restored buffers may drain. */
        if (M->in_grace && M->e->now >= GRACE_MS) {
                M->in_grace = false;
                for (size_t i = 0; i < M->n_claims; i++)
                        M->claims[i].doomed = true;
                /* Members whose ring did not come back are told; seats nobody came back for are freed. */
                for (size_t i = 0; i < M->n_seat_claims; i++)
                        expect_ring_event(M, M->seat_claims[i].peer, PROTO_EV_MEMBER_LEFT, M->seat_claims[i].ring,
                                          M->seat_claims[i].index, M->seat_claims[i].epoch);
                M->n_seat_claims = 0;
                for (int ri = 0; ri < N_RINGS; ri++)
                        ring_unreserve(M, ri);
        }
        registry_expire(M->e->r, M->e->now, &M->e->sink);
        env_flush(M->e);
        for (size_t i = 0; i < M->e->n_sent; i++)
                if (M->e->sent[i].m.type == PROTO_REPLY)
                        CHECK_EQ(M->e->sent[i].m.status, PROTO_STATUS_TIMEOUT);
        absorb(M);
}


/* ---- rings ---- */

/* The ring a byte names: its low two bits (the others carry flags). */
static int ring_at(uint8_t b)
{
        return (b & 3) % N_RINGS;
}

/* A ring's shape the request layer lets through: 1-5 slots, 1-3 seats, latest with slots >=
 * seats + 2, stream with cuda-vmm slots, CUDA slots with a device; restored with some seats
 * declared (epochs up to the generation it names). */
static void op_ring_create(Model *M, Input *in)
{
        RegPeer *p = peer_at(M, take(in));
        uint8_t a = take(in), b = take(in), c = take(in);
        int ri = ring_at(a);
        RingRec *R = &M->rings[ri];
        uint64_t epochs[RING_MEMBERS_MAX] = { 0 };
        RegRingSpec spec = { 0 };
        unsigned want;
        Pending *q;
        Sent *s;

        if (!p)
                return;
        spec.name = ring_names[ri];
        spec.mode = (ProtoMode)(PROTO_MODE_BACKPRESSURE + ((a >> 2) & 3) % 3);
        spec.n_members = 1 + (b & 3) % 3;
        spec.n_slots = 1 + ((b >> 2) & 7) % 5;
        if (spec.mode == PROTO_MODE_LATEST && spec.n_slots < spec.n_members + 2)
                spec.n_slots = spec.n_members + 2;
        spec.kind = spec.mode == PROTO_MODE_STREAM || (b & 0x20) ? PROTO_KIND_CUDA_VMM : PROTO_KIND_MEMFD;
        spec.device = spec.kind == PROTO_KIND_CUDA_VMM ? devices[(b >> 6) & 1] : NULL;
        spec.slot_size = 4096;
        spec.lease_ms = 100;
        if (a & 0x10) {
                spec.restored = true;
                spec.next_epoch = 3 + (c >> 6);
                spec.epochs = epochs;
                for (uint32_t i = 0; i < spec.n_members; i++)
                        if ((c >> i) & 1)
                                epochs[i] = 1 + ((c >> 3) + i) % spec.next_epoch;
        }
        want = R->exists ? PROTO_STATUS_NAME_TAKEN
               : p->acct->buffers >= LIMIT_BUFFERS ? PROTO_STATUS_QUOTA : PROTO_STATUS_OK;
        q = pending_add(M, p, REQ_OTHER);
        if (want == PROTO_STATUS_OK) {
                *R = (RingRec){ .exists = true, .owner = p, .mode = spec.mode, .kind = spec.kind,
                                .slots = spec.n_slots, .members = spec.n_members, .device = spec.device,
                                .next_epoch = spec.restored ? spec.next_epoch : 0 };
                for (uint32_t i = 0; i < spec.n_members; i++)
                        if (epochs[i])
                                R->seats[i] = (SeatRec){ NULL, epochs[i], true };
                /* Members that asked first get their seats, in the order they asked, or are told no. */
                for (size_t i = 0; spec.restored && i < M->n_seat_claims;) {
                        SeatClaimRec *k = &M->seat_claims[i];

                        if (k->ring != ri) {
                                i++;
                                continue;
                        }
                        if (ring_seat_of(R, k->peer) < 0 && k->index < R->members && R->seats[k->index].reserved &&
                            R->seats[k->index].epoch == k->epoch)
                                R->seats[k->index] = (SeatRec){ k->peer, k->epoch, false };
                        else
                                expect_ring_event(M, k->peer, PROTO_EV_MEMBER_LEFT, ri, k->index, k->epoch);
                        seat_claim_drop(M, i);
                }
                if (!M->in_grace)
                        ring_unreserve(M, ri);
        }
        ENV_DO(M->e, p, q->id, registry_ring_create, &spec);
        env_flush(M->e);
        s = env_reply(M->e, p, q->id);
        CHECK_EQ(s->m.status, want);
        absorb(M);
}

typedef struct PartShape {
        ProtoKind kind;
        uint64_t size;
        bool writable;
        const char *device;
} PartShape;

/* What part i of R must be (docs/protocol.md 6.16). */
static PartShape ring_part_shape(const RingRec *R, uint32_t i)
{
        if (i == 0)
                return (PartShape){ PROTO_KIND_MEMFD, 4096, false, NULL };
        if (i <= R->slots)
                return (PartShape){ R->kind, 4096, false, R->device };
        if (i <= R->slots + R->members)
                return (PartShape){ PROTO_KIND_MEMFD, 4096, true, NULL };
        return (PartShape){ PROTO_KIND_CUDA_VMM, 256, true, R->device };
}

/* Does a fit part i (below the ring's part count) of R? Stated from the protocol, not from the
 * code under test. */
static bool ring_part_fits(const RingRec *R, uint32_t i, const RegPublish *a)
{
        const ProtoBufferInfo *m = &a->info;
        bool device_ok = !R->device || (a->device && strcmp(a->device, R->device) == 0);

        if (m->broker_held || a->retire_after)
                return false;
        if (i == 0) /* the control page */
                return m->kind == PROTO_KIND_MEMFD && m->size == 4096 && !m->writable;
        if (i <= R->slots)
                return m->kind == R->kind && m->size == 4096 && !m->writable && device_ok;
        if (i <= R->slots + R->members) /* a member page */
                return m->kind == PROTO_KIND_MEMFD && m->size == 4096 && m->writable;
        /* a stream ring's counters */
        return m->kind == PROTO_KIND_CUDA_VMM && m->writable && m->size >= 128 && m->size <= (64u << 20) && device_ok;
}

/* The parts registered now (the ring is set up once all of them were). */
static uint32_t ring_registered(const RingRec *R)
{
        uint32_t n = 0;

        for (uint32_t i = 0; i < ring_parts_of(R); i++)
                n += R->parts[i] != 0;
        return n;
}

/* Registers part `index` of ring ri as a, checking the status the rules give (an index whose part
 * was let go of takes a new one). True if it was. */
static bool ring_part_do(Model *M, RegPeer *p, int ri, uint32_t index, RegPublish *a)
{
        RingRec *R = &M->rings[ri];
        unsigned want;
        Pending *q;
        Sent *s;

        if (!R->exists)
                want = PROTO_STATUS_NOT_FOUND;
        else if (R->owner != p)
                want = PROTO_STATUS_NOT_OWNER;
        else if (index >= ring_parts_of(R) || R->parts[index] || !ring_part_fits(R, index, a) ||
                 (a->restored && (a->generation == 0 || a->generation > M->e->r->generation)))
                want = PROTO_STATUS_INVALID;
        else if (a->buffer && registry_buffer_by_id(M->e->r, a->buffer))
                want = PROTO_STATUS_KEY_TAKEN;
        else if (p->acct->buffers >= LIMIT_BUFFERS || p->acct->fds >= LIMIT_FDS)
                want = PROTO_STATUS_QUOTA;
        else
                want = PROTO_STATUS_OK;
        a->fd = env_memfd(M->e, 4096);
        q = pending_add(M, p, REQ_OTHER);
        ENV_DO(M->e, p, q->id, registry_ring_part, ring_names[ri], index, a);
        CHECK_EQ(a->fd, -1);
        env_flush(M->e);
        s = env_reply(M->e, p, q->id);
        if (s->m.status != want)
                fprintf(stderr, "ring part %u: %s, want %s (%.*s)\n", index, proto_status_name((unsigned)s->m.status),
                        proto_status_name(want), (int)s->m.message.len, s->m.message.ptr ? s->m.message.ptr : "");
        CHECK_EQ(s->m.status, want);
        if (want == PROTO_STATUS_OK) {
                Buf *b = buf_find(M, s->m.buffer);

                CHECK(!a->buffer || s->m.buffer == a->buffer);
                CHECK_EQ(s->m.generation, a->restored ? a->generation : M->e->r->generation);
                if (!b)
                        b = &M->bufs[M->n_bufs++];
                *b = (Buf){ s->m.buffer, p, a->info.kind };
                R->parts[index] = s->m.buffer;
                R->set_up |= ring_registered(R) == ring_parts_of(R);
                claims_meet(M, s->m.buffer); /* reclaims of a part's id are all refused */
        }
        absorb(M);
        return want == PROTO_STATUS_OK;
}

static bool ring_room(const Model *M)
{
        return M->e->n_fds < ENV_MAX_FDS - 1 && M->n_bufs < MAX_BUFS;
}

/* One part, any index, shaped right or wrong in one respect, under an id of any kind. */
static void op_ring_part(Model *M, Input *in)
{
        RegPeer *p = peer_at(M, take(in));
        uint8_t x = take(in), v = take(in), k = take(in);
        int ri = ring_at(x);
        RingRec *R = &M->rings[ri];
        uint32_t index = (x >> 2) % (R->exists ? ring_parts_of(R) + 2 : RING_PARTS_MAX + 1);
        PartShape ps = ring_part_shape(R, index);
        RegPublish a = { 0 };

        if (!p || !ring_room(M))
                return;
        a.info.kind = ps.kind;
        a.info.size = ps.size;
        a.info.writable = ps.writable;
        a.device = ps.device;
        switch (v & 7) {
        case 4: a.info.kind = 1 + (v >> 3) % 3; break;
        case 5: a.info.size = (v & 8) ? 127 : (v & 16) ? (64u << 20) : 4097; break;
        case 6: a.info.writable = !a.info.writable; break;
        case 7: a.device = (v & 8) ? NULL : devices[(v >> 4) & 1]; break;
        default: break;
        }
        if (a.info.kind == PROTO_KIND_CUDA_LEGACY)
                a.info.kind = PROTO_KIND_MEMFD; /* the request layer refuses legacy parts */
        if (a.info.kind == PROTO_KIND_CUDA_VMM && !a.device)
                a.device = (v & 0x40) ? NULL : devices[0];
        a.info.broker_held = (v & 0xe0) == 0xe0;
        a.retire_after = (v & 0xe0) == 0xc0;
        a.buffer = pick_new_id(M, k);
        if (k & 0x10) {
                a.restored = true;
                a.generation = (k & 0x20) ? M->e->r->generation : (k & 0x40) ? 0 : 1u + (k >> 7);
                if ((k & 0x60) == 0x60)
                        a.generation = M->e->r->generation + 1;
        }
        ring_part_do(M, p, ri, index, &a);
}

/* Registers every part ring ri lacks, each as it must be, until one is refused (a quota). */
static void op_ring_fill(Model *M, Input *in)
{
        uint8_t x = take(in);
        int ri = ring_at(x);
        RingRec *R = &M->rings[ri];

        if (!R->exists)
                return;
        for (uint32_t i = 0; i < ring_parts_of(R) && ring_room(M); i++) {
                PartShape ps = ring_part_shape(R, i);
                RegPublish a = { .info = { .kind = ps.kind, .size = ps.size, .writable = ps.writable },
                                 .device = ps.device };

                if (R->parts[i])
                        continue;
                a.buffer = (x & 0x80) ? 4000000u + (uint64_t)ri * 100 + i : 0;
                if (!ring_part_do(M, R->owner, ri, i, &a))
                        return;
        }
}

/* A join: a free seat and a new epoch, and the parts of that seat; or a seat taken back. */
static void op_ring_join(Model *M, Input *in)
{
        RegPeer *p = peer_at(M, take(in));
        uint8_t x = take(in), y = take(in);
        int ri = ring_at(x), seat;
        RingRec *R = &M->rings[ri];
        uint32_t free_seat = UINT32_MAX;
        bool shared = true, renewing = false;
        unsigned want;
        Pending *q;
        Sent *s;

        if (!p)
                return;
        if (x & 0x80) {
                /* Restored: seat y % 4, the epoch it waits for or another. */
                uint32_t index = y % 4;
                bool waiting = R->exists && index < R->members && !(y & 4);
                uint64_t epoch = waiting ? R->seats[index].epoch : 1u + (y >> 3) % 5;
                bool pending = false;

                if (!R->exists)
                        want = !M->in_grace ? PROTO_STATUS_REVOKED
                               : seat_claims_of(M, p) >= LIMIT_WAITS ? PROTO_STATUS_QUOTA : PROTO_STATUS_OK;
                else if (ring_seat_of(R, p) >= 0)
                        want = PROTO_STATUS_STATE;
                else if (index >= R->members)
                        want = PROTO_STATUS_INVALID;
                else if (!R->seats[index].reserved || R->seats[index].epoch != epoch)
                        want = PROTO_STATUS_REVOKED;
                else
                        want = PROTO_STATUS_OK;
                q = pending_add(M, p, REQ_OTHER);
                ENV_DO(M->e, p, q->id, registry_ring_rejoin, ring_names[ri], index, epoch);
                env_flush(M->e);
                s = env_reply(M->e, p, q->id);
                CHECK_EQ(s->m.status, want);
                pending = proto_has(&s->m, PF_PENDING) && s->m.pending;
                CHECK_EQ(pending, want == PROTO_STATUS_OK && !R->exists);
                if (want == PROTO_STATUS_OK && R->exists) {
                        R->seats[index] = (SeatRec){ p, epoch, false };
                } else if (pending) {
                        CHECK(M->n_seat_claims < MAX_SEAT_CLAIMS);
                        M->seat_claims[M->n_seat_claims++] = (SeatClaimRec){ p, ri, index, epoch };
                }
                absorb(M);
                return;
        }
        /* Joinable once set up, while the control page and the slots are there; the first free seat
         * that has its parts, else not-found while a free one waits for new parts (a retry), else
         * quota. */
        for (uint32_t i = 0; R->exists && i <= R->slots; i++)
                shared &= R->parts[i] != 0;
        for (uint32_t i = 0; R->exists && i < R->members && free_seat == UINT32_MAX; i++) {
                if (R->seats[i].peer || R->seats[i].reserved)
                        continue;
                if (seat_has_parts(R, i))
                        free_seat = i;
                else
                        renewing = true;
        }
        seat = ring_seat_of(R, p);
        if (!R->exists || !R->set_up || !shared)
                want = PROTO_STATUS_NOT_FOUND;
        else if (seat >= 0)
                want = PROTO_STATUS_STATE;
        else if (free_seat == UINT32_MAX)
                want = renewing ? PROTO_STATUS_NOT_FOUND : PROTO_STATUS_QUOTA;
        else
                want = PROTO_STATUS_OK;
        q = pending_add(M, p, REQ_OTHER);
        ENV_DO(M->e, p, q->id, registry_ring_join, ring_names[ri]);
        env_flush(M->e);
        s = env_reply(M->e, p, q->id);
        CHECK_EQ(s->m.status, want);
        if (want == PROTO_STATUS_NOT_FOUND && R->exists && R->set_up && shared)
                env_why(s, REG_E_RING_NO_SEAT_READY);
        if (want == PROTO_STATUS_OK) {
                uint32_t n = R->slots + (R->mode == PROTO_MODE_STREAM ? 3 : 2);
                ProtoIter it;
                ProtoMsg rec;

                R->next_epoch++;
                CHECK_EQ(s->m.index, free_seat);
                CHECK_EQ(s->m.generation, R->next_epoch);
                CHECK_EQ(s->m.mode, R->mode);
                CHECK_EQ(s->m.slots, R->slots);
                CHECK_EQ(s->m.members, R->members);
                proto_iter_init(&it, &s->m.items);
                for (uint32_t i = 0; i < n; i++) {
                        uint32_t part = i <= R->slots ? i : i == R->slots + 1 ? ring_page(R, free_seat)
                                                                                 : ring_counter(R, free_seat);
                        CHECK_EQ(proto_iter_next(&it, &rec), 1);
                        CHECK_EQ(rec.index, part);
                        CHECK_EQ(rec.buffer, R->parts[part]);
                }
                CHECK_EQ(proto_iter_next(&it, &rec), 0);
                R->seats[free_seat] = (SeatRec){ p, R->next_epoch, false };
                expect_ring_event(M, R->owner, PROTO_EV_MEMBER_JOINED, ri, free_seat, R->next_epoch);
        }
        absorb(M);
}

static void op_ring_leave(Model *M, Input *in)
{
        RegPeer *p = peer_at(M, take(in));
        int ri = ring_at(take(in)), seat;
        Pending *q;
        Sent *s;

        if (!p)
                return;
        seat = ring_seat_of(&M->rings[ri], p);
        if (seat >= 0)
                seat_vacate(M, ri, (uint32_t)seat, false);
        q = pending_add(M, p, REQ_OTHER);
        ENV_DO(M->e, p, q->id, registry_ring_leave, ring_names[ri]);
        env_flush(M->e);
        s = env_reply(M->e, p, q->id);
        CHECK_EQ(s->m.status, seat >= 0 ? PROTO_STATUS_OK : PROTO_STATUS_NOT_FOUND);
        absorb(M);
}

/* The producer (or another peer) evicts seat y % 4 at its epoch, or at a stale one. */
static void op_ring_evict(Model *M, Input *in)
{
        RegPeer *p = peer_at(M, take(in));
        uint8_t x = take(in), y = take(in);
        int ri = ring_at(x);
        RingRec *R = &M->rings[ri];
        uint32_t index = y % 4;
        uint64_t epoch = R->exists && index < R->members ? R->seats[index].epoch : 1;
        unsigned want;
        Pending *q;
        Sent *s;

        if (!p)
                return;
        if (y & 4)
                epoch += (y & 8) ? 1 : -1;
        want = !R->exists ? PROTO_STATUS_NOT_FOUND : R->owner != p ? PROTO_STATUS_NOT_OWNER : PROTO_STATUS_OK;
        if (want == PROTO_STATUS_OK && index < R->members && R->seats[index].epoch == epoch) {
                RegPeer *member = R->seats[index].peer;

                /* The member's references on the ring's parts go, mappings included: its page and
                 * counters too, which are still the ring's until the seat is freed. */
                for (size_t i = 0; member && i < M->n_holds; i++)
                        for (uint32_t k = 0; k < ring_parts_of(R); k++)
                                if (M->holds[i].peer == member && R->parts[k] && M->holds[i].buf == R->parts[k])
                                        M->holds[i].refs = 0, M->holds[i].mapped = false;
                seat_vacate(M, ri, index, true);
        }
        q = pending_add(M, p, REQ_OTHER);
        ENV_DO(M->e, p, q->id, registry_ring_evict, ring_names[ri], index, epoch);
        env_flush(M->e);
        s = env_reply(M->e, p, q->id);
        CHECK_EQ(s->m.status, want);
        absorb(M);
}

static void op_ring_close(Model *M, Input *in)
{
        RegPeer *p = peer_at(M, take(in));
        int ri = ring_at(take(in));
        RingRec *R = &M->rings[ri];
        unsigned want;
        Pending *q;
        Sent *s;

        if (!p)
                return;
        want = !R->exists ? PROTO_STATUS_NOT_FOUND : R->owner != p ? PROTO_STATUS_NOT_OWNER : PROTO_STATUS_OK;
        if (want == PROTO_STATUS_OK)
                ring_forget(M, ri);
        q = pending_add(M, p, REQ_OTHER);
        ENV_DO(M->e, p, q->id, registry_ring_close, ring_names[ri]);
        env_flush(M->e);
        s = env_reply(M->e, p, q->id);
        CHECK_EQ(s->m.status, want);
        absorb(M);
}

/* Is buffer a part of some ring in the model? */
static bool model_ring_part(const Model *M, uint64_t buffer)
{
        for (int ri = 0; ri < N_RINGS; ri++)
                for (uint32_t i = 0; M->rings[ri].exists && i < ring_parts_of(&M->rings[ri]); i++)
                        if (M->rings[ri].parts[i] == buffer)
                                return true;
        return false;
}

/* Attaches part x of a ring by id (or, with flag 4, the page or counters last let go of at that
 * index): granted to its members as the seat rules say, refused to everyone else, a buffer that is
 * a ring's part no more to everyone (absorb checks every granted attach of a part). */
static void op_ring_attach(Model *M, Input *in)
{
        RegPeer *p = peer_at(M, take(in));
        uint8_t x = take(in), y = take(in);
        int ri = ring_at(x);
        RingRec *R = &M->rings[ri];
        uint32_t index = R->exists ? y % ring_parts_of(R) : 0;
        uint64_t buffer = (x & 4) && R->let_go[index] ? R->let_go[index]
                          : R->exists && R->parts[index] ? R->parts[index] : pick_buffer(M, y);
        RegBuffer *rb = registry_buffer_by_id(M->e->r, buffer);
        bool part = R->exists && R->parts[index] == buffer, live;
        ProtoMsg d;
        Pending *q;
        Sent *s;

        if (!p)
                return;
        if (rb)
                reply_buffer_describe(rb, &d);
        live = rb && d.state == PROTO_STATE_LIVE;
        q = pending_add(M, p, REQ_ATTACH);
        ENV_DO(M->e, p, q->id, registry_attach, q->id, NULL, buffer, 0, M->e->now);
        env_flush(M->e);
        s = env_reply(M->e, p, q->id);
        if (part && live && d.kind == PROTO_KIND_MEMFD) {
                if (ring_may_attach(R, p, index))
                        CHECK(s->m.status == PROTO_STATUS_OK || s->m.status == PROTO_STATUS_QUOTA);
                else
                        CHECK_EQ(s->m.status, PROTO_STATUS_DENIED);
        }
        /* Of a closed ring, or let go of when a membership ended: nobody's. */
        if (rb && registry_buffer_ring_part(rb) && !model_ring_part(M, buffer) && live && d.kind == PROTO_KIND_MEMFD) {
                CHECK_EQ(s->m.status, PROTO_STATUS_DENIED);
                env_why(s, REG_E_PART_OF_NO_RING);
        }
        absorb(M);
}

static const char *const op_names[N_OPS] = {
        "add", "remove", "hello", "publish", "publish-again", "attach", "attach-id", "release", "retire",
        "free", "unmap", "subscribe", "unsubscribe", "group-join", "time", "reclaim", "ring-create", "ring-part",
        "ring-fill", "ring-join", "ring-leave", "ring-evict", "ring-close", "ring-attach",
};

/* The model hands the registry real memfds (regenv.h's env_memfd): the broker receives them from
 * peers and never creates one. */
const char *const fuzz_fixture_calls[] = { "memfd_create", "ftruncate", FUZZ_ABORT_CALLS, NULL };

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        static Model M;
        static int trace = -1;
        Limits limits = LIMITS_DEFAULT;
        Input in = { data, data + size };
        unsigned ops = 0;

        /* Small limits, so quotas are reached. */
        limits.connections = 4;
        limits.connections_per_uid = 2;
        limits.buffers_per_uid = LIMIT_BUFFERS;
        limits.fds_per_uid = LIMIT_FDS;
        limits.refs_per_peer = 6;
        limits.waits_per_peer = LIMIT_WAITS;
        limits.subs_per_peer = 2;
        limits.max_timeout_ms = 5000;
        if (trace < 0)
                trace = getenv("GPUIPC_FUZZ_TRACE") != NULL; /* print each operation and the gauges */
        /* The bench (with its frame array) is reused: allocating it per input costs more than the run. */
        static Env env;

        memset(&M, 0, sizeof(M));
        M.e = &env;
        env_init_cfg(M.e, (RegConfig){ .limits = limits, .id_seed = 1, .restart_grace_ms = GRACE_MS });
        M.in_grace = true;

        while (in.p < in.end && ops++ < 400) {
                uint8_t op = take(&in) % N_OPS;

                if (trace)
                        fprintf(stderr, "op %2u at %zu: %s\n", op, (size_t)(in.p - data - 1), op_names[op]);
                switch (op) {
                case 0: op_add(&M, &in); break;
                case 1: op_remove(&M, &in); break;
                case 2: op_hello(&M, &in); break;
                case 3: op_publish(&M, &in, false); break;
                case 4: op_publish(&M, &in, true); break;
                case 5: op_attach(&M, &in, false); break;
                case 6: op_attach(&M, &in, true); break;
                case 7: op_buffer(&M, &in, 0); break;
                case 8: op_buffer(&M, &in, 1); break;
                case 9: op_buffer(&M, &in, 2); break;
                case 10: op_buffer(&M, &in, 3); break;
                case 11: op_subscribe(&M, &in, false); break;
                case 12: op_subscribe(&M, &in, true); break;
                case 13: op_join(&M, &in); break;
                case 14: op_time(&M, &in); break;
                case 15: op_reclaim(&M, &in); break;
                case 16: op_ring_create(&M, &in); break;
                case 17: op_ring_part(&M, &in); break;
                case 18: op_ring_fill(&M, &in); break;
                case 19: op_ring_join(&M, &in); break;
                case 20: op_ring_leave(&M, &in); break;
                case 21: op_ring_evict(&M, &in); break;
                case 22: op_ring_close(&M, &in); break;
                default: op_ring_attach(&M, &in); break;
                }
                compare(&M);
                if (trace) {
                        RegGauges g;
                        registry_gauges(M.e->r, &g);
                        for (size_t i = 0; i < M.e->n_sent; i++) {
                        const ProtoMsg *m = &M.e->sent[i].m;
                        fprintf(stderr, "   -> peer %llu: %s %s\n",
                                (unsigned long long)registry_peer_id(M.e->sent[i].to),
                                m->type == PROTO_REPLY ? "reply" : "event",
                                m->type == PROTO_REPLY ? proto_status_name((unsigned)m->status)
                                                       : proto_event_name(m->event));
                }
                fprintf(stderr, "   sent %zu; peers %llu buffers %llu (live %llu retired %llu idle %llu "
                                "orphaned %llu) refs %llu fds %llu waits %llu subs %llu groups %llu\n",
                                M.e->n_sent, (unsigned long long)g.peers, (unsigned long long)g.buffers,
                                (unsigned long long)g.live, (unsigned long long)g.retired,
                                (unsigned long long)g.idle, (unsigned long long)g.orphaned,
                                (unsigned long long)g.refs, (unsigned long long)g.fds,
                                (unsigned long long)g.waits, (unsigned long long)g.subs,
                                (unsigned long long)g.groups);
                }
        }
        /* Everyone leaves: no ring, seat or claim may be left, and only broker-held orphans. */
        for (unsigned i = 0; i < SLOTS; i++) {
                if (!M.slot[i])
                        continue;
                remove_one(&M, i);
                env_flush(M.e);
                absorb(&M);
                compare(&M);
        }
        {
                RegGauges g;

                registry_gauges(M.e->r, &g);
                CHECK_EQ(g.peers, 0);
                CHECK_EQ(g.rings, 0);
                CHECK_EQ(g.ring_members, 0);
                CHECK_EQ(g.refs, 0);
                CHECK_EQ(g.waits, 0);
                CHECK_EQ(g.buffers, g.orphaned);
                CHECK_EQ(M.e->r->n_seat_claims, 0);
        }
        env_fini(M.e);
        M.e = NULL;
        return 0;
}
