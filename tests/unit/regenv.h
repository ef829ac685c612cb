/* A test bench around the registry: real memfds, an outbox whose frames are decoded and checked
 * after every operation, and fd bookkeeping (every fd handed over is closed exactly once).
 * Shared by the registry unit test; header-only so each test binary stays one .c file. */
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "proto.h"
#include "registry.h"
#include "reply.h"

#ifndef ENV_MAX_SENT
#define ENV_MAX_SENT 2048 /* frames one operation may cause */
#endif
#ifndef ENV_MAX_WHY
#define ENV_MAX_WHY ENV_MAX_SENT /* failures and reasons one step may give */
#endif
#ifndef ENV_MAX_FDS
#define ENV_MAX_FDS 1024 /* memfds one test creates */
#endif

/* A failure or a reason as the registry gave it (its code and typed facts), kept past the step that
 * gave it: its strings are copied into strs and gpus (REG_E_DEVICE keeps its first 8), since the
 * registry's are borrowed. The frame
 * it became is found by who it went to and which request or event it is. */
typedef struct WhyRec {
        RegPeer *to;
        bool reply;    /* an error reply to request req; else a reason of event ev */
        uint64_t req;
        ProtoEvent ev;
        bool used;     /* matched to a frame already */
        RegWhy why;
        char strs[3][PROTO_MAX_NAME + 1];
        char gpus[8][PROTO_MAX_UUID + 1]; /* the first 8 of REG_E_DEVICE's */
} WhyRec;

/* One frame the registry asked to deliver, decoded. */
typedef struct Sent {
        RegPeer *to;
        int fd;
        ProtoMsg m;
        ProtoBuf frame; /* the bytes m points into */
        const RegWhy *why; /* the code and facts it words (REG_WHY_NONE: none); tests check these, not text */
} Sent;

/* A memfd the test created, identified by inode (fd numbers get reused). */
typedef struct Tracked {
        int fd;
        ino_t ino;
        bool closed;
} Tracked;

typedef struct Env {
        Registry *r;
        Outbox out;
        RegSink sink; /* the registry's changes, recorded (whys), then into fwd */
        RegSink fwd;  /* the broker's reply layer into out, or the request in progress's sink */
        WhyRec whys[ENV_MAX_WHY]; /* given since the last flush */
        size_t n_whys;
        WhyRec kept[ENV_MAX_WHY]; /* those the frames in sent[] word */
        size_t n_kept;
        uint64_t now;
        Sent sent[ENV_MAX_SENT];
        size_t n_sent;
        Tracked fds[ENV_MAX_FDS];
        size_t n_fds;
        unsigned baseline_fds;
} Env;

static inline unsigned env_count_open_fds(void)
{
        DIR *d = opendir("/proc/self/fd");
        struct dirent *de;
        unsigned n = 0;

        CHECK(d);
        while ((de = readdir(d)))
                if (de->d_name[0] != '.')
                        n++;
        closedir(d);
        return n - 1; /* the directory's own fd */
}

static inline bool env_fd_open(int fd)
{
        return fd >= 0 && fcntl(fd, F_GETFD) >= 0;
}

/* A copy of s in slot i of strs (NULL stays NULL). */
static inline const char *env_keep_str(char (*strs)[PROTO_MAX_NAME + 1], unsigned i, const char *s)
{
        if (!s)
                return NULL;
        CHECK(i < 3);
        snprintf(strs[i], PROTO_MAX_NAME + 1, "%s", s);
        return strs[i];
}

/* Copies src into rec with every string it borrows copied into rec's own storage. */
static inline void env_keep_why(WhyRec *rec, const RegWhy *src)
{
        RegWhy *w = &rec->why;

        *w = *src;
#define KEEP(f) (w->f = env_keep_str(rec->strs, 0, w->f))
#define KEEP2(f, g) (KEEP(f), w->g = env_keep_str(rec->strs, 1, w->g))
        switch (w->code) {
        case REG_E_GROUP_MISMATCH: KEEP(group_mismatch.group); break;
        case REG_E_GROUP_JOINED: KEEP(group_joined.group); break;
        case REG_E_GROUP_TIMEOUT: KEEP(group_timeout.group); break;
        case REG_E_WAIT_MISSED: KEEP(wait_missed.name); break;
        case REG_E_WAIT_TIMEOUT: KEEP(wait_timeout.name); break;
        case REG_E_SAME_PID: KEEP(same_pid.name); break;
        case REG_E_DEVICE:
                KEEP2(device.name, device.device);
                if (w->device.n_gpus > 8)
                        w->device.n_gpus = 8;
                for (uint32_t i = 0; i < w->device.n_gpus; i++)
                        snprintf(rec->gpus[i], sizeof(rec->gpus[i]), "%s", src->device.gpus[i]);
                w->device.gpus = (const char (*)[PROTO_MAX_UUID + 1])rec->gpus;
                break;
        case REG_E_PART_OF_NO_RING: KEEP(part_of_no_ring.name); break;
        case REG_E_RING_MEMBERS_ONLY: KEEP2(ring_members_only.name, ring_members_only.ring); break;
        case REG_E_RING_EXISTS: KEEP(ring_exists.ring); break;
        case REG_E_RING_OTHERS: KEEP(ring_others.ring); break;
        case REG_E_NO_RING: KEEP(no_ring.ring); break;
        case REG_E_PART_MISFIT: KEEP(part_misfit.ring); break;
        case REG_E_RING_SETTING_UP: KEEP(ring_setting_up.ring); break;
        case REG_E_RING_MEMBER: KEEP(ring_member.ring); break;
        case REG_E_RING_NO_SEAT_READY: KEEP(ring_no_seat_ready.ring); break;
        case REG_E_RING_FULL: KEEP(ring_full.ring); break;
        case REG_E_RING_SEATS: KEEP(ring_seats.ring); break;
        case REG_E_SEAT_NOT_WAITING: KEEP(seat_not_waiting.ring); break;
        case REG_E_RING_GONE: KEEP(ring_gone.ring); break;
        case REG_E_NOT_MEMBER: KEEP(not_member.ring); break;
        case REG_E_NOT_LIVE: KEEP(not_live.name); break;
        case REG_E_NOTHING_UNDER: KEEP(nothing_under.name); break;
        case REG_E_NAME_ORPHANED: KEEP(name_orphaned.name); break;
        case REG_E_NAME_TAKEN: KEEP(name_taken.name); break;
        case REG_E_NOT_OWNER: KEEP(not_owner.name); break;
        case REG_E_CLAIM_REPUBLISHED: KEEP2(claim_republished.name, claim_republished.held_name); break;
        case REG_E_CLAIM_DRAINED: KEEP(claim_drained.name); break;
        case REG_E_CLAIM_RING_PART: KEEP(claim_ring_part.name); break;
        case REG_E_CLAIM_RETIRED: KEEP(claim_retired.name); break;
        case REG_E_CLAIM_RETIRE_AFTER: KEEP(claim_retire_after.name); break;
        case REG_E_CLAIM_UNKNOWN: KEEP(claim_unknown.name); break;
        default: break;
        }
#undef KEEP2
#undef KEEP
}

/* Keeps a failure or reason given to `to` (an error reply to request req, or event ev's reason). */
static inline void env_record_why(Env *e, RegPeer *to, bool reply, uint64_t req, ProtoEvent ev, const RegWhy *w)
{
        WhyRec *rec;

        if (w->code == REG_WHY_NONE)
                return;
        CHECK(e->n_whys < ENV_MAX_WHY);
        rec = &e->whys[e->n_whys++];
        rec->to = to;
        rec->reply = reply;
        rec->req = req;
        rec->ev = ev;
        rec->used = false;
        env_keep_why(rec, w);
}

/* The registry's sink in the bench: keeps each change's code and facts, then hands it on to fwd. */
static inline void env_emit(void *ctx, const RegChange *c)
{
        Env *e = ctx;

        if (c->type == REG_CH_ANSWER)
                env_record_why(e, c->to, true, c->req, 0, &c->why);
        else if (c->type == REG_CH_EVENT || c->type == REG_CH_RING_EVENT)
                env_record_why(e, c->to, false, 0, c->event, &c->why);
        e->fwd.emit(e->fwd.ctx, c);
}

/* The code and facts behind frame s: the first kept record for its peer and its request (or its
 * event) that no earlier frame took. Frames go out in the order their changes came, so the k-th
 * frame of a kind to a peer is the k-th record of that kind. */
static inline const RegWhy *env_match_why(Env *e, const Sent *s)
{
        static const RegWhy none = { REG_WHY_NONE };

        for (size_t i = 0; i < e->n_kept; i++) {
                WhyRec *k = &e->kept[i];

                if (k->used || k->to != s->to || k->reply != (s->m.type == PROTO_REPLY))
                        continue;
                if (k->reply ? k->req != s->m.reply : k->ev != s->m.event)
                        continue;
                k->used = true;
                return &k->why;
        }
        return &none;
}

/* Starts e over with a new registry made with cfg (its epoch is 77 and its clock starts at 0); the
 * frame and fd arrays are reused as they are. Undo with env_fini(). */
static inline void env_init_cfg(Env *e, RegConfig cfg)
{
        e->n_sent = e->n_fds = 0;
        e->now = 0;
        e->out = (Outbox)OUTBOX_INIT;
        e->sink = (RegSink){ env_emit, e };
        e->fwd = reply_sink(&e->out);
        e->n_whys = e->n_kept = 0;
        e->baseline_fds = env_count_open_fds();
        cfg.epoch = 77;
        cfg.start_ms = 0;
        CHECK_EQ(registry_new(&e->r, &cfg), 0);
        CHECK_EQ(registry_epoch(e->r), 77);
}

/* ... with the given limits (NULL: the defaults), ids drawn from a fixed seed, and no restart grace. */
static inline void env_init(Env *e, const Limits *limits)
{
        env_init_cfg(e, (RegConfig){ .limits = limits ? *limits : LIMITS_DEFAULT, .id_seed = 1 });
}

/* A registry with the given limits (NULL: the defaults). Free with env_free(). */
static inline Env *env_new(const Limits *limits)
{
        Env *e = calloc(1, sizeof(*e));

        CHECK(e);
        env_init(e, limits);
        return e;
}

/* A sealed memfd of size bytes, tracked. The registry will own it once passed in. */
static inline int env_memfd(Env *e, size_t size)
{
        int fd = memfd_create("gpuipc-test", MFD_CLOEXEC | MFD_ALLOW_SEALING);
        struct stat st;

        CHECK(fd >= 0);
        CHECK_EQ(ftruncate(fd, (off_t)size), 0);
        CHECK_EQ(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), 0);
        CHECK_EQ(fstat(fd, &st), 0);
        CHECK(e->n_fds < ENV_MAX_FDS);
        e->fds[e->n_fds++] = (Tracked){ fd, st.st_ino, false };
        return fd;
}

static inline Tracked *env_tracked_by_fd(Env *e, int fd)
{
        struct stat st;

        if (fstat(fd, &st) < 0)
                return NULL;
        for (size_t i = 0; i < e->n_fds; i++)
                if (e->fds[i].ino == st.st_ino && !e->fds[i].closed)
                        return &e->fds[i];
        return NULL;
}

static inline void env_drop_sent(Env *e)
{
        for (size_t i = 0; i < e->n_sent; i++)
                proto_buf_free(&e->sent[i].frame);
        e->n_sent = 0;
}


/* Marks tracked fds the registry closed directly (publishes it refused) and returns how many. */
static inline unsigned env_reap_closed(Env *e)
{
        unsigned n = 0;

        for (size_t i = 0; i < e->n_fds; i++) {
                Tracked *t = &e->fds[i];
                struct stat st;

                if (t->closed)
                        continue;
                if (fstat(t->fd, &st) < 0 || st.st_ino != t->ino) {
                        t->closed = true;
                        n++;
                }
        }
        return n;
}

static inline unsigned env_held_fds(const Env *e)
{
        unsigned n = 0;

        for (size_t i = 0; i < e->n_fds; i++)
                n += !e->fds[i].closed;
        return n;
}

typedef struct HolderSum {
        uint64_t refs, holders;
} HolderSum;

static inline void env_sum_holder(const RegPeer *p, uint32_t refs, void *ud)
{
        HolderSum *h = ud;

        CHECK(p);
        CHECK(refs > 0);
        h->refs += refs;
        h->holders++;
}

/* Whether any registered buffer is a view of segment (which then outlives its producer for it). */
static inline bool env_has_views(Env *e, uint64_t segment)
{
        for (RegBuffer *b = registry_buffer_after(e->r, 0); b; b = registry_buffer_next(e->r, b)) {
                ProtoMsg m;

                reply_buffer_describe(b, &m);
                if (proto_has(&m, PF_SEGMENT) && m.segment == segment)
                        return true;
        }
        return false;
}

/* Cross-checks the registry's gauges against what its views show, and the fds it holds against
 * the memfds that are still open. */
static inline void env_check(Env *e)
{
        uint64_t refs = 0, peer_refs = 0, waits = 0, subs = 0, owned = 0, n_peers = 0;
        uint64_t live = 0, retired = 0, idle = 0, orphaned = 0, n_buf = 0, named = 0;
        uint64_t shared[_PROTO_KIND_MAX] = { 0 }, held[_PROTO_KIND_MAX] = { 0 };
        RegGauges g;

        registry_gauges(e->r, &g);
        for (RegBuffer *b = registry_buffer_after(e->r, 0); b; b = registry_buffer_next(e->r, b)) {
                HolderSum hs = { 0 };
                ProtoMsg m;

                reply_buffer_describe(b, &m);
                CHECK(registry_buffer_by_id(e->r, m.buffer) == b);
                registry_buffer_holders(b, env_sum_holder, &hs);
                CHECK_EQ(hs.refs, m.refs);
                CHECK_EQ(hs.holders, m.holders);
                CHECK(m.holders <= m.refs);
                refs += m.refs;
                n_buf++;
                /* Bytes shared: the memory of every buffer but views (their segment's); held: each
                 * buffer once per peer holding a reference to it. */
                if (!proto_has(&m, PF_SEGMENT))
                        shared[m.kind] += m.size;
                held[m.kind] += m.size * m.holders;
                live += m.state == PROTO_STATE_LIVE;
                retired += m.state == PROTO_STATE_RETIRED;
                idle += m.state == PROTO_STATE_IDLE;
                orphaned += m.owner == 0;
                /* Live means published under its name (a ring's part is live under none, unless
                 * its producer published it again); retired means someone still holds it; idle
                 * means drained and kept for its owner. */
                if (m.state != PROTO_STATE_LIVE)
                        CHECK(registry_buffer_by_name(e->r, registry_buffer_name(b)) != b);
                else if (!registry_buffer_ring_part(b))
                        CHECK(registry_buffer_by_name(e->r, registry_buffer_name(b)) == b);
                named += registry_buffer_by_name(e->r, registry_buffer_name(b)) == b;
                if (m.state == PROTO_STATE_RETIRED)
                        CHECK(m.refs > 0 || m.restored); /* a restored one waits for the grace */
                if (m.state == PROTO_STATE_IDLE)
                        CHECK(m.refs == 0 && (m.owner != 0 || env_has_views(e, m.buffer)));
                if (m.owner == 0)
                        CHECK(m.broker_held);
                if (proto_has(&m, PF_SEGMENT)) {
                        /* A view lies inside a registered segment of the same producer and kind. */
                        RegBuffer *sb = registry_buffer_by_id(e->r, m.segment);
                        ProtoMsg sm;

                        CHECK(sb);
                        reply_buffer_describe(sb, &sm);
                        CHECK(!proto_has(&sm, PF_SEGMENT));
                        CHECK_EQ(sm.kind, m.kind);
                        CHECK_EQ(sm.owner, m.owner);
                        CHECK_EQ(m.segment_size, sm.size);
                        CHECK(m.offset <= sm.size && m.size <= sm.size - m.offset);
                }
        }
        for (RegPeer *p = registry_peer_first(e->r); p; p = registry_peer_next(e->r, p)) {
                ProtoMsg m;

                reply_peer_describe(p, &m);
                CHECK(!registry_peer_lost(p)); /* every frame for it could be built */
                CHECK_EQ(m.peer, registry_peer_id(p));
                peer_refs += m.refs;
                waits += m.waits;
                subs += m.subs;
                owned += m.buffers;
                n_peers++;
        }
        CHECK_EQ(g.buffers, n_buf);
        CHECK_EQ(g.live, live);
        CHECK_EQ(g.retired, retired);
        CHECK_EQ(g.idle, idle);
        CHECK_EQ(g.orphaned, orphaned);
        CHECK_EQ(g.live + g.retired + g.idle, g.buffers);
        CHECK_EQ(g.refs, refs);
        CHECK_EQ(g.refs, peer_refs);
        CHECK_EQ(g.waits, waits);
        CHECK_EQ(g.subs, subs);
        CHECK_EQ(g.peers, n_peers);
        CHECK_EQ(owned + orphaned, n_buf);
        for (int k = 0; k < _PROTO_KIND_MAX; k++) {
                CHECK_EQ(g.shared_bytes[k], shared[k]);
                CHECK_EQ(g.held_bytes[k], held[k]);
        }
        CHECK(g.names >= named);
        env_reap_closed(e);
        CHECK_EQ(g.fds, env_held_fds(e));
}

/* Takes the outbox: decodes every frame (each must be a well-formed reply or event whose header
 * announces its fd), then closes the fds on the close list, checking each is one of ours and
 * still open. Returns the number of frames. */
static inline size_t env_flush(Env *e)
{
        env_drop_sent(e);
        /* The whys given since the last flush belong to the frames decoded now. */
        e->n_kept = e->n_whys;
        for (size_t i = 0; i < e->n_whys; i++) {
                e->kept[i] = e->whys[i];
                env_keep_why(&e->kept[i], &e->whys[i].why);
        }
        e->n_whys = 0;
        for (size_t i = 0; i < e->out.n_frames; i++) {
                OutFrame *f = &e->out.frames[i];
                Sent *s = &e->sent[e->n_sent];
                ProtoHeader h;
                ProtoField fld = _PF_MAX;
                int r;

                CHECK(e->n_sent < ENV_MAX_SENT);
                CHECK(f->to);
                CHECK_EQ(proto_header_parse(f->frame.data, f->frame.len, &h), 0);
                CHECK_EQ(h.body_len, f->frame.len - PROTO_HEADER_SIZE);
                CHECK_EQ(h.n_fds, f->fd >= 0 ? 1 : 0);
                r = proto_msg_decode(f->frame.data + PROTO_HEADER_SIZE, h.body_len, &s->m, &fld);
                if (r)
                        fprintf(stderr, "undecodable frame: %s (field %s)\n", proto_strerror(r),
                                proto_field_name(fld));
                CHECK_EQ(r, 0);
                CHECK(s->m.type == PROTO_REPLY || s->m.type == PROTO_EVENT);
                if (f->fd >= 0) {
                        /* A borrowed fd: still open, one of ours, not yet closed. */
                        CHECK(env_fd_open(f->fd));
                        CHECK(env_tracked_by_fd(e, f->fd));
                }
                s->to = f->to;
                s->fd = f->fd;
                s->why = env_match_why(e, s);
                s->frame = f->frame; /* steal: the decoded message points into it */
                f->frame = (ProtoBuf){ 0 };
                e->n_sent++;
        }
        for (size_t i = 0; i < e->out.n_close; i++) {
                Tracked *t = env_tracked_by_fd(e, e->out.close_fds[i]);

                /* Each fd closed exactly once: it is open and ours until now. */
                CHECK(t);
                t->closed = true;
        }
        outbox_clear(&e->out);
        env_check(e);
        return e->n_sent;
}

/* Frees the registry and checks that every fd it was given is closed and nothing else was. */
static inline void env_fini(Env *e)
{
        RegGauges g;

        env_flush(e);
        registry_gauges(e->r, &g);
        CHECK_EQ(g.fds, env_held_fds(e));
        e->r = registry_free(e->r);
        CHECK(e->r == NULL);
        for (size_t i = 0; i < e->n_fds; i++)
                if (!e->fds[i].closed)
                        CHECK(!env_fd_open(e->fds[i].fd)); /* no fd was opened since: no reuse */
        env_drop_sent(e);
        outbox_deinit(&e->out);
        CHECK_EQ(env_count_open_fds(), e->baseline_fds);
}

static inline void env_free(Env *e)
{
        env_fini(e);
        free(e);
}

/* ---- operations ---- */

/* What an operation returned: a failure's code has its facts in why, and a status of its own in the
 * reply layer's table (a code without one would be answered as a mere `invalid`). */
static inline void env_check_result(const ReplyRequest *rq, int r)
{
        if (r > 0) {
                CHECK_EQ(rq->why.code, (RegWhyCode)r);
                CHECK(reply_status(rq->why.code) != PROTO_STATUS_OK);
        }
}

/* Runs registry operation OP (its arguments after the peer: ...) as request id of peer p, the way
 * broker/request.c does: its changes go to the reply layer for this request, and what it returns
 * becomes the reply (a code's status and text; -ENOMEM cuts p off). */
#define ENV_DO(e, p, id, OP, ...)                                                  \
        do {                                                                       \
                ReplyRequest rq_;                                                  \
                int r_;                                                            \
                                                                                   \
                reply_request_init(&rq_, &(e)->out, (p), (id));                    \
                (e)->fwd = rq_.sink; /* its changes are kept on their way */       \
                r_ = OP((e)->r, (p), __VA_ARGS__, &rq_.why, &(e)->sink);           \
                (e)->fwd = reply_sink(&(e)->out);                                  \
                env_check_result(&rq_, r_);                                        \
                if (r_ > 0)                                                        \
                        env_record_why((e), (p), true, (id), 0, &rq_.why);         \
                reply_request_done(&rq_, r_);                                      \
        } while (0)

/* ---- peers ---- */

static inline RegPeer *env_peer(Env *e, uint32_t uid, uint32_t pid, uint64_t pidns)
{
        PeerCreds c = { .uid = uid, .gid = uid, .pid = pid, .pidns = pidns };
        RegPeer *p = NULL;

        CHECK_EQ(registry_peer_add(e->r, &c, e->now, NULL, &p, NULL), 0);
        CHECK(p);
        return p;
}

/* A peer of another PID namespace that the kernel shows (pid in the broker's namespace, self_pid in
 * its own), or, with pid 0, one it does not show. */
static inline RegPeer *env_peer_ns(Env *e, uint32_t uid, uint32_t pid, uint64_t pidns, uint32_t self_pid)
{
        PeerCreds c = { .uid = uid, .gid = uid, .pid = pid, .pidns = pidns, .self_pid = self_pid };
        RegPeer *p = NULL;

        CHECK_EQ(registry_peer_add(e->r, &c, e->now, NULL, &p, NULL), 0);
        CHECK(p);
        return p;
}

/* A hello that declares the PID the peer sees for itself and its /dev/shm. */
static inline void env_hello_self(Env *e, RegPeer *p, uint64_t self_pid, uint64_t pidns, uint64_t shm_dev,
                                  uint64_t shm_ino, const char *const *gpus)
{
        PeerHello h = { .pid = self_pid, .pidns = pidns, .shm_dev = shm_dev, .shm_ino = shm_ino, .label = "self",
                        .n_gpus = 1, .gpus = gpus };

        CHECK_EQ(registry_peer_hello(e->r, p, &h, NULL), 0);
}

static inline void env_hello(Env *e, RegPeer *p, uint64_t pidns, const char *label, uint32_t n_gpus,
                             const char *const *gpus)
{
        PeerHello h = { .pid = registry_peer_creds(p)->pid, .pidns = pidns, .label = label, .n_gpus = n_gpus,
                        .gpus = gpus };

        CHECK_EQ(registry_peer_hello(e->r, p, &h, NULL), 0);
        CHECK(registry_peer_said_hello(p));
}

static inline size_t env_remove(Env *e, RegPeer *p)
{
        registry_peer_remove(e->r, p, &e->sink);
        return env_flush(e);
}

/* ---- finding what was sent ---- */

static inline size_t env_count_to(const Env *e, const RegPeer *p)
{
        size_t n = 0;

        for (size_t i = 0; i < e->n_sent; i++)
                n += e->sent[i].to == p;
        return n;
}

/* The one reply to request id sent to p. */
static inline Sent *env_reply(Env *e, const RegPeer *p, uint64_t id)
{
        Sent *found = NULL;

        for (size_t i = 0; i < e->n_sent; i++) {
                Sent *s = &e->sent[i];
                if (s->to == p && s->m.type == PROTO_REPLY && s->m.reply == id) {
                        CHECK(!found); /* exactly one reply per request */
                        found = s;
                }
        }
        if (!found)
                fprintf(stderr, "no reply %llu to peer %llu\n", (unsigned long long)id,
                        (unsigned long long)registry_peer_id(p));
        CHECK(found);
        return found;
}

static inline bool env_has_reply(const Env *e, const RegPeer *p, uint64_t id)
{
        for (size_t i = 0; i < e->n_sent; i++)
                if (e->sent[i].to == p && e->sent[i].m.type == PROTO_REPLY && e->sent[i].m.reply == id)
                        return true;
        return false;
}

static inline size_t env_count_events(const Env *e, const RegPeer *p, ProtoEvent ev)
{
        size_t n = 0;

        for (size_t i = 0; i < e->n_sent; i++)
                n += e->sent[i].to == p && e->sent[i].m.type == PROTO_EVENT && e->sent[i].m.event == ev;
        return n;
}

static inline Sent *env_event(Env *e, const RegPeer *p, ProtoEvent ev)
{
        for (size_t i = 0; i < e->n_sent; i++) {
                Sent *s = &e->sent[i];
                if (s->to == p && s->m.type == PROTO_EVENT && s->m.event == ev)
                        return s;
        }
        fprintf(stderr, "no %s event to peer %llu\n", proto_event_name(ev),
                (unsigned long long)registry_peer_id(p));
        CHECK(!"event missing");
        return NULL;
}

/* Position of s in the order the registry queued frames. */
static inline size_t env_pos(const Env *e, const Sent *s)
{
        return (size_t)(s - e->sent);
}

/* Checks a reply's status; on a mismatch prints the message the registry gave. */
static inline void env_check_status(const Sent *s, unsigned want)
{
        if (s->m.status != want)
                fprintf(stderr, "status %s (%.*s), want %s\n", proto_status_name((unsigned)s->m.status),
                        (int)s->m.message.len, s->m.message.ptr ? s->m.message.ptr : "",
                        proto_status_name(want));
        CHECK_EQ(s->m.status, want);
        if (want != PROTO_STATUS_OK) {
                CHECK(proto_has(&s->m, PF_ERROR));
                CHECK(proto_str_eq(s->m.error, proto_status_name(want)));
                CHECK(proto_has(&s->m, PF_MESSAGE) && s->m.message.len > 0);
        }
}

/* The code behind a reply's error (or an event's reason): s->why, after checking it is want; on a
 * mismatch prints the text the client got. */
static inline const RegWhy *env_why(const Sent *s, RegWhyCode want)
{
        const ProtoStr *t = s->m.type == PROTO_EVENT ? &s->m.reason : &s->m.message;

        if (s->why->code != want)
                fprintf(stderr, "code %u ('%.*s'), want %u\n", (unsigned)s->why->code, (int)t->len,
                        t->ptr ? t->ptr : "", (unsigned)want);
        CHECK_EQ(s->why->code, want);
        return s->why;
}
