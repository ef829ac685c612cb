/* Fuzz target: the registry driven by operation sequences.
 *
 * Each input byte stream is a program over four peer slots: add and remove peers, hello, publish
 * (memfd, cuda-vmm or cuda-legacy; broker-held or not; retire_after; metadata; real memfds),
 * publish again by id, publish under an id of the producer's choosing or restored after a restart
 * (live or retired, with a generation), reclaim (matching or not, before or after its producer
 * came back), attach by name (waiting) or id, release, retire, free, unmap, subscribe, unsubscribe,
 * group join, time passing (expire, and the end of the restart grace) and cancelling every wait.
 * Requests follow what broker/request.c lets through (valid names, legacy never broker-held,
 * group counts above 0).
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
 *   - pending waits, groups and names match the gauges; no deadline is left in the past.
 * At the end the registry is freed and every fd it was given must be closed. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"

#define ENV_MAX_SENT 512
#define ENV_MAX_FDS 128
#include "regenv.h"

#define SLOTS 4
#define MAX_PENDING 256
#define MAX_HOLDS 256
#define MAX_BUFS 64
#define MAX_SUBS 64
#define MAX_CLAIMS 64
#define GRACE_MS 2000

static const char *const names[] = { "a", "a/b", "a/c", "b", "frames/0", "frames/1", "c", "d" };
#define N_NAMES (sizeof(names) / sizeof(names[0]))
static const char *const prefixes[] = { "", "a", "a/", "b", "x" };
static const char *const groups[] = { "g1", "g2" };
static const char *const devices[] = { "GPU-a", "GPU-b" };
static const uint32_t timeouts[] = { 0, 1, 50, 1000, PROTO_TIMEOUT_INFINITE };
static const uint8_t handle[PROTO_LEGACY_HANDLE_SIZE] = { 7 };
static const uint8_t meta[] = { 0x81, 0xa5, 's', 'h', 'a', 'p', 'e', 0x92, 0x04, 0x04 };

enum { REQ_ATTACH, REQ_JOIN, REQ_OTHER };

typedef struct Pending {
        uint64_t id;
        RegPeer *peer;
        int type;
        int name;  /* attach waits: index into names */
        int group; /* joins: index into groups */
        bool waiting;
} Pending;

typedef struct Hold {
        RegPeer *peer;
        uint64_t buf;
        uint32_t refs;
        bool mapped;
} Hold;

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

typedef struct Model {
        Env *e;
        RegPeer *slot[SLOTS];
        uint64_t next_id;
        Pending pending[MAX_PENDING];
        size_t n_pending;
        Hold holds[MAX_HOLDS];
        size_t n_holds;
        Buf bufs[MAX_BUFS];
        size_t n_bufs;
        SubRec subs[MAX_SUBS];
        size_t n_subs;
        ClaimRec claims[MAX_CLAIMS];
        size_t n_claims;
        uint64_t claim_seq;
        bool in_grace;
} Model;

typedef struct Input {
        const uint8_t *p, *end;
} Input;

static uint8_t take(Input *in)
{
        return in->p < in->end ? *in->p++ : 0;
}

/* ---- model bookkeeping ---- */

static Hold *hold_find(Model *M, RegPeer *p, uint64_t buf)
{
        for (size_t i = 0; i < M->n_holds; i++)
                if (M->holds[i].peer == p && M->holds[i].buf == buf)
                        return &M->holds[i];
        return NULL;
}

static Hold *hold_get(Model *M, RegPeer *p, uint64_t buf)
{
        Hold *h = hold_find(M, p, buf);

        if (h)
                return h;
        CHECK(M->n_holds < MAX_HOLDS);
        M->holds[M->n_holds] = (Hold){ p, buf, 0, false };
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

/* Would the registry take a reclaim of (generation, uid, kind, name) for rb? (registry-claims.c) */
static bool claim_matches(RegBuffer *rb, uint64_t generation, uint32_t uid, ProtoKind kind, const char *name)
{
        ProtoMsg d;

        registry_buffer_describe(rb, &d);
        return d.generation == generation && d.uid == uid && d.kind == kind && proto_str_eq(d.name, name) &&
               d.state != PROTO_STATE_IDLE;
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
                if (claim_matches(rb, c->generation, c->uid, c->kind, c->name)) {
                        Hold *h = hold_get(M, c->peer, id);
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
                                Hold *h = hold_get(M, s->to, m->buffer);
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
                        }
                        continue;
                }
                CHECK_EQ(m->type, PROTO_EVENT);
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
                        Hold *h = hold_find(M, s->to, m->buffer);

                        CHECK(proto_has(m, PF_REASON));
                        if (claim_doomed_take(M, s->to, m->buffer))
                                break;
                        CHECK(h && h->refs > 0);
                        h->refs = 0;
                        break;
                }
                case PROTO_EV_FREED: {
                        Hold *h = hold_find(M, s->to, m->buffer);
                        CHECK(h && h->mapped);
                        h->mapped = false;
                        break;
                }
                default:
                        CHECK(!"unexpected event");
                }
        }
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
        CHECK_EQ(g.names, g.live + names_waiting);
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

                registry_peer_describe(p, &d);
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

                        registry_buffer_describe(rb, &d);
                        CHECK_EQ(d.refs, refs);
                        CHECK_EQ(d.owner, b->owner ? registry_peer_id(b->owner) : 0);
                } else {
                        /* Forgotten: nobody holds it, and everyone who mapped it was told. */
                        CHECK_EQ(refs, 0);
                        CHECK(!mapped);
                }
        }
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
                            .pidns = (c >> 3) % 3 };
        RegPeer *p = NULL;
        int r;

        if (M->slot[s])
                return;
        r = registry_peer_add(M->e->r, &creds, M->e->now, NULL, &p, NULL, 0);
        if (r == PROTO_STATUS_QUOTA)
                return;
        CHECK_EQ(r, 0);
        M->slot[s] = p;
}

/* Takes peer slot s out of the registry and the model (without flushing the outbox). */
static void remove_one(Model *M, unsigned s)
{
        RegPeer *p = M->slot[s];

        registry_peer_remove(M->e->r, p, &M->e->out);
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
                CHECK_EQ(registry_peer_hello(M->e->r, p, &h), PROTO_STATUS_STATE);
        else
                CHECK_EQ(registry_peer_hello(M->e->r, p, &h), 0);
}

static uint64_t generation_of(RegBuffer *rb)
{
        ProtoMsg d;

        registry_buffer_describe(rb, &d);
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
        a.kind = 1 + (f & 3) % 3;
        a.size = 4096;
        a.device = a.kind == PROTO_KIND_MEMFD ? NULL : devices[d % 2];
        a.handle = a.kind == PROTO_KIND_CUDA_LEGACY ? handle : NULL;
        a.broker_held = a.kind != PROTO_KIND_CUDA_LEGACY && (f & 4);
        a.retire_after = (f >> 3) % 4;
        a.writable = true;
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
                if (a.kind != PROTO_KIND_CUDA_LEGACY)
                        a.fd = env_memfd(M->e, 4096);
        }
        q = pending_add(M, p, REQ_OTHER);
        registry_publish(M->e->r, p, q->id, &a, &M->e->out);
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
                        *b = (Buf){ s->m.buffer, p, registry_buffer_by_id(M->e->r, s->m.buffer) ? a.kind : 0 };
                if (!again && registry_buffer_by_id(M->e->r, s->m.buffer)) {
                        ProtoMsg dd;
                        registry_buffer_describe(registry_buffer_by_id(M->e->r, s->m.buffer), &dd);
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
                registry_buffer_describe(rb, &d);
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
        registry_reclaim(M->e->r, p, q->id, &a, &M->e->out);
        env_flush(M->e);
        s = env_reply(M->e, p, q->id);
        if (refs_now + a.refs > 6) { /* the fuzzer's refs_per_peer */
                CHECK_EQ(s->m.status, PROTO_STATUS_QUOTA);
        } else if (rb) {
                bool match = claim_matches(rb, a.generation, a.owner_uid, a.kind, a.name);

                CHECK_EQ(s->m.status, match ? PROTO_STATUS_OK : PROTO_STATUS_REVOKED);
                if (match) {
                        Hold *h = hold_get(M, p, a.buffer);
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
                registry_attach(M->e->r, p, q->id, NULL, pick_buffer(M, n), 0, M->e->now, &M->e->out);
        else
                registry_attach(M->e->r, p, q->id, names[n % N_NAMES], 0, timeouts[t % 5], M->e->now,
                                &M->e->out);
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
                registry_release(M->e->r, p, q->id, buf, &M->e->out);
                break;
        case 1:
                registry_retire(M->e->r, p, q->id, buf, flags & 1, &M->e->out);
                break;
        case 2:
                registry_free_buffer(M->e->r, p, q->id, buf, flags & 1, &M->e->out);
                break;
        default:
                registry_unmap(M->e->r, p, q->id, buf, &M->e->out);
                break;
        }
        env_flush(M->e);
        s = env_reply(M->e, p, q->id);
        if (which == 0) {
                Hold *h = hold_find(M, p, buf);
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
                Hold *h = hold_find(M, p, buf);
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

                registry_unsubscribe(M->e->r, p, q->id, sub, &M->e->out);
                env_flush(M->e);
                s = env_reply(M->e, p, q->id);
                CHECK_EQ(s->m.status == PROTO_STATUS_OK, mine);
                for (size_t i = 0; mine && i < M->n_subs; i++)
                        if (M->subs[i].id == sub)
                                M->subs[i] = M->subs[--M->n_subs];
        } else {
                registry_subscribe(M->e->r, p, q->id, prefixes[x % 5], &M->e->out);
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
        registry_group_join(M->e->r, p, q->id, groups[g % 2], 1 + (g >> 1) % 4, 1 + t * 7u, M->e->now,
                            &M->e->out);
        env_flush(M->e);
        if (!env_has_reply(M->e, p, q->id))
                q->waiting = true;
        absorb(M);
}

static void op_time(Model *M, Input *in)
{
        uint8_t t = take(in);

        if (t == 0xff) {
                registry_cancel_waits(M->e->r, PROTO_STATUS_SHUTDOWN, "stopping", &M->e->out);
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
        }
        registry_expire(M->e->r, M->e->now, &M->e->out);
        env_flush(M->e);
        for (size_t i = 0; i < M->e->n_sent; i++)
                if (M->e->sent[i].m.type == PROTO_REPLY)
                        CHECK_EQ(M->e->sent[i].m.status, PROTO_STATUS_TIMEOUT);
        absorb(M);
}

static const char *const op_names[16] = {
        "add", "remove", "hello", "publish", "publish-again", "attach", "attach-id", "release", "retire",
        "free", "unmap", "subscribe", "unsubscribe", "group-join", "time", "reclaim",
};

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
        limits.buffers_per_uid = 6;
        limits.fds_per_uid = 5;
        limits.refs_per_peer = 6;
        limits.waits_per_peer = 3;
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
                uint8_t op = take(&in) % 16;

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
                default: op_reclaim(&M, &in); break;
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
        env_fini(M.e);
        M.e = NULL;
        return 0;
}
