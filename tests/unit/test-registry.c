/* broker/registry.c: the lifetime contract without sockets. Every operation's outbox is decoded
 * and the registry's gauges are cross-checked after each one (regenv.h); fds are real memfds and
 * each must be closed exactly once. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "regenv.h"

static uint64_t next_req = 1;

static const uint8_t handle64[PROTO_LEGACY_HANDLE_SIZE] = { 0xca, 0xfe, [63] = 0x01 };

enum { FD_AUTO = 0, FD_FORCE = 1, FD_NONE = -1 };

typedef struct Pub {
        const char *name;
        ProtoKind kind;   /* 0: memfd */
        uint64_t buffer;  /* publish this idle buffer again */
        uint64_t key;     /* new memory: the id the producer chose (0: the broker picks one) */
        bool restored;    /* registered again after a restart, with this generation */
        uint64_t generation;
        bool retired;     /* restored as retired */
        bool held;        /* broker_held */
        uint32_t retire_after;
        const char *device;
        const uint8_t *meta;
        uint32_t meta_len;
        bool clear_meta;  /* publishing again: replace the metadata with none */
        int fd_mode;      /* FD_AUTO: an fd for memfd and cuda-vmm new buffers */
        uint64_t segment; /* a view of this segment, at offset, of size (0: 4096) */
        uint64_t offset, size;
        uint64_t segment_size; /* with FD_FORCE: the segment's memory travels, this large */
} Pub;

/* Publishes and returns the reply. */
static Sent *publish(Env *e, RegPeer *p, Pub o)
{
        RegPublish a = { 0 };
        uint64_t id = next_req++;
        bool want_fd;

        a.name = o.name;
        a.again = o.buffer != 0;
        a.buffer = o.buffer ? o.buffer : o.key;
        a.restored = o.restored;
        a.generation = o.generation;
        a.retired = o.retired;
        a.info.kind = o.kind ? o.kind : PROTO_KIND_MEMFD;
        a.info.size = o.size ? o.size : 4096;
        a.info.offset = o.offset;
        a.info.segment = o.segment;
        a.segment_size = o.segment_size;
        a.device = o.device;
        a.meta = o.meta;
        a.meta_len = o.meta_len;
        a.has_meta = o.meta || o.clear_meta;
        a.handle = a.info.kind == PROTO_KIND_CUDA_LEGACY ? handle64 : NULL;
        want_fd = o.fd_mode == FD_FORCE ||
                  (o.fd_mode == FD_AUTO && !o.buffer && !o.segment && a.info.kind != PROTO_KIND_CUDA_LEGACY);
        a.fd = want_fd ? env_memfd(e, o.segment_size ? o.segment_size : 4096) : -1;
        a.info.writable = true;
        a.info.broker_held = o.held;
        a.retire_after = o.retire_after;
        ENV_DO(e, p, id, registry_publish, &a);
        CHECK_EQ(a.fd, -1); /* taken in every case */
        env_flush(e);
        return env_reply(e, p, id);
}

/* Publishes and checks success; returns the buffer id. */
static uint64_t publish_ok(Env *e, RegPeer *p, Pub o)
{
        Sent *s = publish(e, p, o);

        env_check_status(s, PROTO_STATUS_OK);
        CHECK(proto_has(&s->m, PF_BUFFER) && s->m.buffer > 0);
        CHECK(proto_has(&s->m, PF_GENERATION) && s->m.generation > 0);
        return s->m.buffer;
}

static uint64_t attach_name(Env *e, RegPeer *p, const char *name, uint32_t timeout)
{
        uint64_t id = next_req++;

        ENV_DO(e, p, id, registry_attach, id, name, 0, timeout, e->now);
        env_flush(e);
        return id;
}

static uint64_t attach_id(Env *e, RegPeer *p, uint64_t buffer)
{
        uint64_t id = next_req++;

        ENV_DO(e, p, id, registry_attach, id, NULL, buffer, 0, e->now);
        env_flush(e);
        return id;
}

/* Attaches by name (no wait) and checks success; returns the reply. */
static Sent *attach_ok(Env *e, RegPeer *p, const char *name)
{
        Sent *s = env_reply(e, p, attach_name(e, p, name, 0));

        env_check_status(s, PROTO_STATUS_OK);
        return s;
}

static Sent *release(Env *e, RegPeer *p, uint64_t buffer)
{
        uint64_t id = next_req++;

        ENV_DO(e, p, id, registry_release, buffer);
        env_flush(e);
        return env_reply(e, p, id);
}

static Sent *retire(Env *e, RegPeer *p, uint64_t buffer, bool admin)
{
        uint64_t id = next_req++;

        ENV_DO(e, p, id, registry_retire, buffer, admin);
        env_flush(e);
        return env_reply(e, p, id);
}

static Sent *free_buf(Env *e, RegPeer *p, uint64_t buffer, bool admin)
{
        uint64_t id = next_req++;

        ENV_DO(e, p, id, registry_free_buffer, buffer, admin);
        env_flush(e);
        return env_reply(e, p, id);
}

static Sent *unmap(Env *e, RegPeer *p, uint64_t buffer)
{
        uint64_t id = next_req++;

        ENV_DO(e, p, id, registry_unmap, buffer);
        env_flush(e);
        return env_reply(e, p, id);
}

static Sent *subscribe(Env *e, RegPeer *p, const char *prefix)
{
        uint64_t id = next_req++;

        ENV_DO(e, p, id, registry_subscribe, prefix);
        env_flush(e);
        return env_reply(e, p, id);
}

static Sent *unsubscribe(Env *e, RegPeer *p, uint64_t sub)
{
        uint64_t id = next_req++;

        ENV_DO(e, p, id, registry_unsubscribe, sub);
        env_flush(e);
        return env_reply(e, p, id);
}

static uint64_t join(Env *e, RegPeer *p, const char *group, uint32_t members, uint32_t timeout)
{
        uint64_t id = next_req++;

        ENV_DO(e, p, id, registry_group_join, id, group, members, timeout, e->now);
        env_flush(e);
        return id;
}

static size_t expire(Env *e, uint64_t now)
{
        e->now = now;
        registry_expire(e->r, now, &e->sink);
        return env_flush(e);
}

static RegGauges gauges(Env *e)
{
        RegGauges g;

        registry_gauges(e->r, &g);
        return g;
}

static ProtoState state_of(Env *e, uint64_t buffer)
{
        RegBuffer *b = registry_buffer_by_id(e->r, buffer);
        ProtoMsg m;

        CHECK(b);
        reply_buffer_describe(b, &m);
        return m.state;
}

static uint64_t refs_of(Env *e, uint64_t buffer)
{
        RegBuffer *b = registry_buffer_by_id(e->r, buffer);
        ProtoMsg m;

        CHECK(b);
        reply_buffer_describe(b, &m);
        return m.refs;
}

/* ---- tests ---- */

/* The basic life of a buffer: publish, attach (a reference and the fd), release, retire, drained, with every gauge
 * right at each step. */
static void test_publish_attach_release_retire(void)
{
        Env *e = env_new(NULL);
        RegPeer *P = env_peer(e, 1000, 10, 1), *C = env_peer(e, 1001, 11, 1);
        uint64_t buf, gen;
        Sent *s;
        RegGauges g;

        s = publish(e, P, (Pub){ .name = "cam/0" });
        env_check_status(s, PROTO_STATUS_OK);
        buf = s->m.buffer;
        gen = s->m.generation;
        CHECK_EQ(env_count_to(e, P), 1);
        g = gauges(e);
        CHECK_EQ(g.buffers, 1);
        CHECK_EQ(g.live, 1);
        CHECK_EQ(g.fds, 1);
        CHECK_EQ(g.names, 1);
        CHECK(registry_buffer_by_name(e->r, "cam/0") == registry_buffer_by_id(e->r, buf));

        /* First attach: a reference and the fd. */
        s = attach_ok(e, C, "cam/0");
        CHECK_EQ(s->m.buffer, buf);
        CHECK_EQ(s->m.generation, gen);
        CHECK(proto_str_eq(s->m.name, "cam/0"));
        CHECK_EQ(s->m.kind, PROTO_KIND_MEMFD);
        CHECK_EQ(s->m.state, PROTO_STATE_LIVE);
        CHECK_EQ(s->m.size, 4096);
        CHECK_EQ(s->m.refs, 1);
        CHECK_EQ(s->m.owner, registry_peer_id(P));
        CHECK_EQ(s->m.uid, 1000);
        CHECK(proto_has(&s->m, PF_CACHED) && !s->m.cached);
        CHECK(s->fd >= 0);
        CHECK(!proto_has(&s->m, PF_HANDLE));

        /* Second attach: another reference, the fd stays home. */
        s = attach_ok(e, C, "cam/0");
        CHECK(s->m.cached);
        CHECK_EQ(s->fd, -1);
        CHECK_EQ(s->m.refs, 2);
        CHECK_EQ(s->m.holders, 1);
        CHECK_EQ(gauges(e).refs, 2);

        /* Release both; a third release finds nothing. */
        env_check_status(release(e, C, buf), PROTO_STATUS_OK);
        CHECK_EQ(refs_of(e, buf), 1);
        env_check_status(release(e, C, buf), PROTO_STATUS_OK);
        CHECK_EQ(refs_of(e, buf), 0);
        env_check_status(release(e, C, buf), PROTO_STATUS_NOT_ATTACHED);
        env_check_status(release(e, C, 9999), PROTO_STATUS_NOT_ATTACHED);
        env_check_status(release(e, P, buf), PROTO_STATUS_NOT_ATTACHED);

        /* Retire with no references: drained at once, to the producer, after the reply. */
        s = retire(e, P, buf, false);
        env_check_status(s, PROTO_STATUS_OK);
        CHECK_EQ(env_count_events(e, P, PROTO_EV_DRAINED), 1);
        CHECK(env_pos(e, s) < env_pos(e, env_event(e, P, PROTO_EV_DRAINED)));
        CHECK_EQ(env_event(e, P, PROTO_EV_DRAINED)->m.buffer, buf);
        CHECK_EQ(env_count_to(e, C), 0);
        CHECK_EQ(state_of(e, buf), PROTO_STATE_IDLE);
        CHECK(registry_buffer_by_name(e->r, "cam/0") == NULL);
        CHECK_EQ(gauges(e).names, 0);
        /* Retiring again is harmless and drains nothing more. */
        env_check_status(retire(e, P, buf, false), PROTO_STATUS_OK);
        CHECK_EQ(env_count_events(e, P, PROTO_EV_DRAINED), 0);

        /* An idle buffer takes no attaches. */
        env_check_status(env_reply(e, C, attach_id(e, C, buf)), PROTO_STATUS_STATE);
        env_check_status(env_reply(e, C, attach_name(e, C, "cam/0", 0)), PROTO_STATUS_NOT_FOUND);
        env_check_status(env_reply(e, C, attach_id(e, C, 4242)), PROTO_STATUS_NOT_FOUND);

        /* Free: the consumer that still has the fd mapped is told, the fd is closed. */
        s = free_buf(e, P, buf, false);
        env_check_status(s, PROTO_STATUS_OK);
        CHECK_EQ(env_count_events(e, C, PROTO_EV_FREED), 1);
        CHECK_EQ(env_event(e, C, PROTO_EV_FREED)->m.buffer, buf);
        CHECK(registry_buffer_by_id(e->r, buf) == NULL);
        CHECK_EQ(gauges(e).fds, 0);
        CHECK_EQ(env_held_fds(e), 0);
        env_check_status(free_buf(e, P, buf, false), PROTO_STATUS_NOT_FOUND);
        env_free(e);
}

/* Retiring a held buffer keeps existing references valid, stops new attaches, and the last release drains it (its
 * reply before the drained event). */
static void test_retire_while_held(void)
{
        Env *e = env_new(NULL);
        RegPeer *P = env_peer(e, 1000, 10, 1), *C = env_peer(e, 1001, 11, 1);
        uint64_t buf = publish_ok(e, P, (Pub){ .name = "x" });
        Sent *s;

        attach_ok(e, C, "x");
        attach_ok(e, C, "x");
        s = retire(e, P, buf, false);
        env_check_status(s, PROTO_STATUS_OK);
        CHECK_EQ(env_count_events(e, P, PROTO_EV_DRAINED), 0);
        CHECK_EQ(state_of(e, buf), PROTO_STATE_RETIRED);
        /* Existing references stay valid; new attaches by name wait or fail, by id are refused. */
        env_check_status(env_reply(e, C, attach_name(e, C, "x", 0)), PROTO_STATUS_NOT_FOUND);
        env_check_status(env_reply(e, C, attach_id(e, C, buf)), PROTO_STATUS_STATE);
        env_check_status(release(e, C, buf), PROTO_STATUS_OK);
        CHECK_EQ(env_count_events(e, P, PROTO_EV_DRAINED), 0);
        s = release(e, C, buf);
        env_check_status(s, PROTO_STATUS_OK);
        /* The last release drains: the reply to the consumer comes first, then the event. */
        CHECK_EQ(env_count_events(e, P, PROTO_EV_DRAINED), 1);
        CHECK(env_pos(e, s) < env_pos(e, env_event(e, P, PROTO_EV_DRAINED)));
        CHECK_EQ(state_of(e, buf), PROTO_STATE_IDLE);
        /* Only the owner (or an admin) retires. */
        env_check_status(retire(e, C, buf, false), PROTO_STATUS_NOT_OWNER);
        env_check_status(retire(e, C, 777, false), PROTO_STATUS_NOT_FOUND);
        env_free(e);
}

/* Attaches for a name not yet published wait, and the publish answers every waiter, oldest first, each with the fd. */
static void test_attach_waits_for_publish(void)
{
        Env *e = env_new(NULL);
        RegPeer *P = env_peer(e, 1000, 10, 1), *C1 = env_peer(e, 1001, 11, 1), *C2 = env_peer(e, 1002, 12, 1);
        uint64_t w1, w2, buf;
        Sent *s1, *s2;

        e->now = 100;
        w1 = attach_name(e, C1, "late", 1000);
        CHECK_EQ(e->n_sent, 0); /* no reply yet: it waits */
        e->now = 150;
        w2 = attach_name(e, C2, "late", 5000);
        CHECK_EQ(e->n_sent, 0);
        CHECK_EQ(gauges(e).waits, 2);
        CHECK_EQ(gauges(e).names, 1);
        CHECK_EQ(registry_next_deadline(e->r), 1100);
        CHECK(registry_buffer_by_name(e->r, "late") == NULL);

        e->now = 200;
        buf = publish_ok(e, P, (Pub){ .name = "late" });
        /* Both waiters are answered by the publish, oldest first, each with the fd. */
        s1 = env_reply(e, C1, w1);
        s2 = env_reply(e, C2, w2);
        env_check_status(s1, PROTO_STATUS_OK);
        env_check_status(s2, PROTO_STATUS_OK);
        CHECK(env_pos(e, s1) < env_pos(e, s2));
        CHECK(env_pos(e, env_reply(e, P, next_req - 1)) < env_pos(e, s1));
        CHECK_EQ(s1->m.buffer, buf);
        CHECK(s1->fd >= 0 && s2->fd >= 0);
        CHECK_EQ(refs_of(e, buf), 2);
        CHECK_EQ(gauges(e).waits, 0);
        CHECK_EQ(registry_next_deadline(e->r), UINT64_MAX);
        CHECK_EQ(expire(e, 100000), 0); /* nothing left to time out */
        env_free(e);
}

/* An attach waiting for a name times out at its own deadline, earliest first, with a clamp to max_timeout_ms for
 * "forever", and leaves no wait behind. */
static void test_attach_timeout(void)
{
        Limits l = LIMITS_DEFAULT;
        Env *e;
        RegPeer *C;
        uint64_t w1, w2, w3;
        Sent *s;

        l.max_timeout_ms = 10000;
        e = env_new(&l);
        C = env_peer(e, 1001, 11, 1);
        e->now = 100;
        w1 = attach_name(e, C, "never", 500);
        w2 = attach_name(e, C, "never/2", 300);
        w3 = attach_name(e, C, "forever", PROTO_TIMEOUT_INFINITE); /* clamped to the limit */
        CHECK_EQ(e->n_sent, 0);
        CHECK_EQ(registry_next_deadline(e->r), 400);
        CHECK_EQ(gauges(e).names, 3);

        CHECK_EQ(expire(e, 399), 0);
        CHECK_EQ(expire(e, 400), 1);
        s = env_reply(e, C, w2);
        env_check_status(s, PROTO_STATUS_TIMEOUT);
        CHECK_STREQ(env_why(s, REG_E_WAIT_TIMEOUT)->wait_timeout.name, "never/2");
        CHECK_EQ(registry_next_deadline(e->r), 600);
        CHECK_EQ(gauges(e).names, 2);

        /* One expire answers everything that is due, in deadline order. */
        CHECK_EQ(expire(e, 1000000), 2);
        CHECK(env_pos(e, env_reply(e, C, w1)) < env_pos(e, env_reply(e, C, w3)));
        env_check_status(env_reply(e, C, w1), PROTO_STATUS_TIMEOUT);
        env_check_status(env_reply(e, C, w3), PROTO_STATUS_TIMEOUT);
        CHECK_EQ(registry_counters(e->r)->timeouts, 3);
        CHECK_EQ(gauges(e).waits, 0);
        CHECK_EQ(gauges(e).names, 0);
        CHECK_EQ(registry_next_deadline(e->r), UINT64_MAX);

        /* The clamp: an infinite wait ends at max_timeout_ms. */
        e->now = 0;
        w3 = attach_name(e, C, "forever", PROTO_TIMEOUT_INFINITE);
        CHECK_EQ(registry_next_deadline(e->r), 10000);
        CHECK_EQ(expire(e, 10000), 1);
        env_check_status(env_reply(e, C, w3), PROTO_STATUS_TIMEOUT);

        /* Without a timeout, attaching an unknown name fails at once. */
        env_check_status(env_reply(e, C, attach_name(e, C, "nope", 0)), PROTO_STATUS_NOT_FOUND);
        CHECK_EQ(gauges(e).names, 0);
        env_free(e);
}

/* retire_after retires a buffer on its Nth attach: subscribers hear it, later attaches find nothing, and extra
 * waiters keep waiting for the next publish. */
static void test_retire_after(void)
{
        Env *e = env_new(NULL);
        RegPeer *P = env_peer(e, 1000, 10, 1), *C1 = env_peer(e, 1001, 11, 1), *C2 = env_peer(e, 1002, 12, 1),
                *C3 = env_peer(e, 1003, 13, 1), *S = env_peer(e, 1004, 14, 1);
        uint64_t buf, w1, w2, w3;

        subscribe(e, S, "");
        buf = publish_ok(e, P, (Pub){ .name = "once-twice", .retire_after = 2 });
        attach_ok(e, C1, "once-twice");
        CHECK_EQ(state_of(e, buf), PROTO_STATE_LIVE);
        attach_ok(e, C2, "once-twice");
        /* The second attach retired it: subscribers hear so, new attaches find nothing. */
        CHECK_EQ(state_of(e, buf), PROTO_STATE_RETIRED);
        CHECK_EQ(env_count_events(e, S, PROTO_EV_RETIRED), 1);
        env_check_status(env_reply(e, C3, attach_name(e, C3, "once-twice", 0)), PROTO_STATUS_NOT_FOUND);
        release(e, C1, buf);
        release(e, C2, buf);
        CHECK_EQ(env_count_events(e, P, PROTO_EV_DRAINED), 1);
        CHECK_EQ(env_count_events(e, S, PROTO_EV_DRAINED), 1);

        /* With waiters: the first two get it, the third keeps waiting for the next publish. */
        w1 = attach_name(e, C1, "batch", 1000);
        w2 = attach_name(e, C2, "batch", 1000);
        w3 = attach_name(e, C3, "batch", 1000);
        buf = publish_ok(e, P, (Pub){ .name = "batch", .retire_after = 2 });
        env_check_status(env_reply(e, C1, w1), PROTO_STATUS_OK);
        env_check_status(env_reply(e, C2, w2), PROTO_STATUS_OK);
        CHECK(!env_has_reply(e, C3, w3));
        CHECK_EQ(state_of(e, buf), PROTO_STATE_RETIRED);
        CHECK_EQ(gauges(e).waits, 1);
        /* The next buffer under that name serves the remaining waiter. */
        publish_ok(e, P, (Pub){ .name = "batch" });
        env_check_status(env_reply(e, C3, w3), PROTO_STATUS_OK);

        /* retire_after 1 with exactly one waiter: the name entry goes away during the wake-up. */
        w1 = attach_name(e, C1, "single", 1000);
        buf = publish_ok(e, P, (Pub){ .name = "single", .retire_after = 1 });
        env_check_status(env_reply(e, C1, w1), PROTO_STATUS_OK);
        CHECK_EQ(state_of(e, buf), PROTO_STATE_RETIRED);
        CHECK(registry_buffer_by_name(e->r, "single") == NULL);
        release(e, C1, buf);
        CHECK_EQ(state_of(e, buf), PROTO_STATE_IDLE);

        /* Published again, the count starts over. */
        env_check_status(publish(e, P, (Pub){ .name = "single", .buffer = buf, .retire_after = 2 }),
                         PROTO_STATUS_OK);
        attach_ok(e, C1, "single");
        CHECK_EQ(state_of(e, buf), PROTO_STATE_LIVE);
        attach_ok(e, C2, "single");
        CHECK_EQ(state_of(e, buf), PROTO_STATE_RETIRED);
        env_free(e);
}

/* Another peer, even of the same uid, cannot publish under a live name (its fd is closed); once retired the name is
 * free for anyone. */
static void test_name_taken(void)
{
        Env *e = env_new(NULL);
        RegPeer *P1 = env_peer(e, 1000, 10, 1), *P2 = env_peer(e, 1000, 20, 1);
        uint64_t buf = publish_ok(e, P1, (Pub){ .name = "shared" });
        unsigned before = env_held_fds(e);
        Sent *s;

        /* Another peer, even of the same uid, cannot take a live name; its fd is closed. */
        s = publish(e, P2, (Pub){ .name = "shared" });
        env_check_status(s, PROTO_STATUS_NAME_TAKEN);
        CHECK_STREQ(env_why(s, REG_E_NAME_TAKEN)->name_taken.name, "shared");
        CHECK_EQ(s->why->name_taken.owner.peer, registry_peer_id(P1));
        CHECK_EQ(env_held_fds(e), before);
        CHECK_EQ(gauges(e).buffers, 1);
        CHECK(registry_buffer_by_name(e->r, "shared") == registry_buffer_by_id(e->r, buf));
        /* Once retired, the name is free for anyone. */
        retire(e, P1, buf, false);
        publish_ok(e, P2, (Pub){ .name = "shared" });
        env_free(e);
}

/* A producer publishing again under its own live name replaces the buffer: the old one is retired (subscribers
 * told), the name points at the new one. */
static void test_same_producer_replaces(void)
{
        Env *e = env_new(NULL);
        RegPeer *P = env_peer(e, 1000, 10, 1), *C = env_peer(e, 1001, 11, 1), *S = env_peer(e, 1002, 12, 1);
        uint64_t b1, b2, g1;
        Sent *s;

        subscribe(e, S, "frame");
        s = publish(e, P, (Pub){ .name = "frame" });
        b1 = s->m.buffer;
        g1 = s->m.generation;
        attach_ok(e, C, "frame");
        s = publish(e, P, (Pub){ .name = "frame" });
        env_check_status(s, PROTO_STATUS_OK);
        b2 = s->m.buffer;
        CHECK(b2 != b1);
        CHECK(s->m.generation > g1);
        /* The old one is retired (still held, so not drained), the name points at the new one. */
        CHECK_EQ(state_of(e, b1), PROTO_STATE_RETIRED);
        CHECK_EQ(state_of(e, b2), PROTO_STATE_LIVE);
        CHECK(registry_buffer_by_name(e->r, "frame") == registry_buffer_by_id(e->r, b2));
        CHECK_EQ(env_count_events(e, S, PROTO_EV_RETIRED), 1);
        CHECK_EQ(env_event(e, S, PROTO_EV_RETIRED)->m.buffer, b1);
        CHECK_EQ(env_count_events(e, S, PROTO_EV_PUBLISHED), 1);
        CHECK_EQ(env_event(e, S, PROTO_EV_PUBLISHED)->m.buffer, b2);
        CHECK_EQ(attach_ok(e, C, "frame")->m.buffer, b2);
        release(e, C, b1);
        CHECK_EQ(env_count_events(e, P, PROTO_EV_DRAINED), 1);
        CHECK_EQ(env_event(e, P, PROTO_EV_DRAINED)->m.buffer, b1);
        CHECK_EQ(state_of(e, b1), PROTO_STATE_IDLE);

        /* Replacing an unreferenced buffer drains it in the same step. */
        s = publish(e, P, (Pub){ .name = "other" });
        b1 = s->m.buffer;
        s = publish(e, P, (Pub){ .name = "other" });
        CHECK_EQ(env_count_events(e, P, PROTO_EV_DRAINED), 1);
        CHECK_EQ(state_of(e, b1), PROTO_STATE_IDLE);
        env_free(e);
}

/* An idle (drained) buffer may be published again by its own producer only, under a free name, with a new
 * generation and new metadata. */
static void test_republish_idle(void)
{
        static const uint8_t meta1[] = { 0x81, 0xa1, 'a', 0x01 }, meta2[] = { 0x81, 0xa1, 'b', 0x02 };
        Env *e = env_new(NULL);
        RegPeer *P = env_peer(e, 1000, 10, 1), *C = env_peer(e, 1001, 11, 1), *Q = env_peer(e, 1000, 12, 1);
        uint64_t buf, gen, other;
        unsigned held;
        Sent *s;
        ProtoMsg m;

        s = publish(e, P, (Pub){ .name = "slot/0", .meta = meta1, .meta_len = sizeof(meta1) });
        buf = s->m.buffer;
        gen = s->m.generation;
        CHECK(attach_ok(e, C, "slot/0")->fd >= 0);

        /* Not while live, nor while retired and held. */
        env_check_status(publish(e, P, (Pub){ .name = "slot/0", .buffer = buf }), PROTO_STATUS_STATE);
        retire(e, P, buf, false);
        env_check_status(publish(e, P, (Pub){ .name = "slot/0", .buffer = buf }), PROTO_STATUS_STATE);
        release(e, C, buf);
        CHECK_EQ(state_of(e, buf), PROTO_STATE_IDLE);

        /* Not by another peer (even of the same uid), not an unknown id, not under a taken name. */
        env_check_status(publish(e, Q, (Pub){ .name = "slot/0", .buffer = buf }), PROTO_STATUS_NOT_OWNER);
        publish_ok(e, C, (Pub){ .name = "taken" });
        env_check_status(publish(e, P, (Pub){ .name = "taken", .buffer = buf }), PROTO_STATUS_NAME_TAKEN);
        CHECK_EQ(state_of(e, buf), PROTO_STATE_IDLE);
        env_check_status(publish(e, P, (Pub){ .name = "slot/0", .buffer = 9999 }), PROTO_STATUS_NOT_FOUND);

        /* Again by id: same buffer, new generation, metadata kept; no new fd is taken. */
        held = env_held_fds(e);
        s = publish(e, P, (Pub){ .name = "slot/0", .buffer = buf });
        env_check_status(s, PROTO_STATUS_OK);
        CHECK_EQ(s->m.buffer, buf);
        CHECK(s->m.generation > gen);
        gen = s->m.generation;
        CHECK_EQ(env_held_fds(e), held);
        CHECK_EQ(gauges(e).buffers, 2); /* this one and C's "taken" */
        CHECK_EQ(registry_counters(e->r)->republishes, 1);
        reply_buffer_describe(registry_buffer_by_id(e->r, buf), &m);
        CHECK_EQ(m.state, PROTO_STATE_LIVE);
        CHECK(m.meta.len == sizeof(meta1) && memcmp(m.meta.ptr, meta1, sizeof(meta1)) == 0);
        /* The consumer kept its mapping: the fd does not travel again. */
        s = attach_ok(e, C, "slot/0");
        CHECK(s->m.cached);
        CHECK_EQ(s->fd, -1);
        CHECK_EQ(s->m.generation, gen);
        release(e, C, buf);

        /* Under another name, with new metadata; an fd sent along is closed, not kept. */
        retire(e, P, buf, false);
        s = publish(e, P, (Pub){ .name = "slot/renamed", .buffer = buf, .meta = meta2, .meta_len = sizeof(meta2),
                                 .fd_mode = FD_FORCE });
        env_check_status(s, PROTO_STATUS_OK);
        CHECK_EQ(env_held_fds(e), held);
        CHECK(registry_buffer_by_name(e->r, "slot/renamed") == registry_buffer_by_id(e->r, buf));
        CHECK(registry_buffer_by_name(e->r, "slot/0") == NULL);
        reply_buffer_describe(registry_buffer_by_id(e->r, buf), &m);
        CHECK(m.meta.len == sizeof(meta2) && memcmp(m.meta.ptr, meta2, sizeof(meta2)) == 0);
        CHECK(proto_str_eq(m.name, "slot/renamed"));

        /* Publishing again without metadata keeps it; with an empty map clears it. */
        retire(e, P, buf, false);
        env_check_status(publish(e, P, (Pub){ .name = "slot/renamed", .buffer = buf }), PROTO_STATUS_OK);
        reply_buffer_describe(registry_buffer_by_id(e->r, buf), &m);
        CHECK(proto_has(&m, PF_META) && m.meta.len == sizeof(meta2));
        retire(e, P, buf, false);
        env_check_status(publish(e, P, (Pub){ .name = "slot/renamed", .buffer = buf, .clear_meta = true }),
                         PROTO_STATUS_OK);
        reply_buffer_describe(registry_buffer_by_id(e->r, buf), &m);
        CHECK(!proto_has(&m, PF_META));

        /* Republishing under a name the same producer has live replaces that buffer. */
        other = publish_ok(e, P, (Pub){ .name = "slot/1" });
        retire(e, P, buf, false);
        env_check_status(publish(e, P, (Pub){ .name = "slot/1", .buffer = buf }), PROTO_STATUS_OK);
        CHECK_EQ(state_of(e, other), PROTO_STATE_IDLE);
        CHECK_EQ(state_of(e, buf), PROTO_STATE_LIVE);
        env_free(e);
}

/* A buffer's fd travels to each peer once: a later attach is "cached" until the peer unmaps, and then the fd is
 * sent again. */
static void test_fd_cached_and_unmap(void)
{
        Env *e = env_new(NULL);
        RegPeer *P = env_peer(e, 1000, 10, 1), *C = env_peer(e, 1001, 11, 1), *D = env_peer(e, 1002, 12, 1);
        uint64_t buf = publish_ok(e, P, (Pub){ .name = "m" });
        Sent *s;
        int fd;

        s = attach_ok(e, C, "m");
        fd = s->fd;
        CHECK(fd >= 0 && !s->m.cached);
        release(e, C, buf);
        /* The mapping outlives the reference: the next attach is cached. */
        s = attach_ok(e, C, "m");
        CHECK(s->m.cached);
        CHECK_EQ(s->fd, -1);
        CHECK_EQ(registry_counters(e->r)->attaches_cached, 1);
        /* Each peer gets the fd once. */
        s = attach_ok(e, D, "m");
        CHECK(!s->m.cached);
        CHECK_EQ(s->fd, fd);

        /* After unmap, the fd travels again (and unmap while holding keeps the reference). */
        env_check_status(unmap(e, C, buf), PROTO_STATUS_OK);
        CHECK_EQ(refs_of(e, buf), 2);
        s = attach_ok(e, C, "m");
        CHECK(!s->m.cached);
        CHECK_EQ(s->fd, fd);
        release(e, C, buf);
        release(e, C, buf);
        env_check_status(unmap(e, C, buf), PROTO_STATUS_OK);
        s = env_reply(e, C, attach_id(e, C, buf));
        env_check_status(s, PROTO_STATUS_OK);
        CHECK(!s->m.cached && s->fd == fd);
        release(e, C, buf);

        /* Unmapping something unknown, or never mapped, is fine. */
        env_check_status(unmap(e, C, 12345), PROTO_STATUS_OK);
        env_check_status(unmap(e, P, buf), PROTO_STATUS_OK);
        /* Unmapped peers are not told when the buffer is freed; mapped ones are. */
        env_check_status(unmap(e, C, buf), PROTO_STATUS_OK);
        release(e, D, buf);
        free_buf(e, P, buf, false);
        CHECK_EQ(env_count_events(e, C, PROTO_EV_FREED), 0);
        CHECK_EQ(env_count_events(e, D, PROTO_EV_FREED), 1);
        env_free(e);
}

/* A cuda-legacy buffer never sends an fd: every attach reply carries the IPC handle and device instead. */
static void test_legacy_handle(void)
{
        static const char *const gpu[] = { "GPU-1" };
        Env *e = env_new(NULL);
        RegPeer *P = env_peer(e, 1000, 10, 5), *C = env_peer(e, 1001, 11, 5);
        uint64_t buf;
        Sent *s;

        env_hello(e, C, 5, "c", 1, gpu);
        buf = publish_ok(e, P, (Pub){ .name = "leg", .kind = PROTO_KIND_CUDA_LEGACY, .device = "GPU-1" });
        CHECK_EQ(gauges(e).fds, 0);
        for (int i = 0; i < 2; i++) {
                /* No fd ever; the handle is in every reply. */
                s = attach_ok(e, C, "leg");
                CHECK_EQ(s->fd, -1);
                CHECK(!s->m.cached);
                CHECK(proto_has(&s->m, PF_HANDLE));
                CHECK(memcmp(s->m.handle.ptr, handle64, PROTO_LEGACY_HANDLE_SIZE) == 0);
                CHECK(proto_str_eq(s->m.device, "GPU-1"));
                CHECK_EQ(s->m.kind, PROTO_KIND_CUDA_LEGACY);
                release(e, C, buf);
        }
        env_free(e);
}

/* A dead consumer's references, waits, group joins and subscriptions all go; a buffer still held by another
 * consumer does not drain. */
static void test_consumer_death(void)
{
        Env *e = env_new(NULL);
        RegPeer *P = env_peer(e, 1000, 10, 1), *C = env_peer(e, 1001, 11, 1), *D = env_peer(e, 1002, 12, 1);
        uint64_t buf = publish_ok(e, P, (Pub){ .name = "d" }), other;

        attach_ok(e, C, "d");
        attach_ok(e, C, "d");
        attach_ok(e, D, "d");
        retire(e, P, buf, false);
        /* A consumer with pending waits, a group join and a subscription dies. */
        attach_name(e, C, "pending", 1000);
        join(e, C, "g", 2, 1000);
        subscribe(e, C, "");
        CHECK_EQ(gauges(e).waits, 2);
        env_remove(e, C);
        CHECK_EQ(env_count_events(e, P, PROTO_EV_DRAINED), 0); /* D still holds it */
        CHECK_EQ(refs_of(e, buf), 1);
        CHECK_EQ(gauges(e).waits, 0);
        CHECK_EQ(gauges(e).subs, 0);
        CHECK_EQ(gauges(e).groups, 0);
        CHECK_EQ(gauges(e).names, 0);
        CHECK_EQ(registry_next_deadline(e->r), UINT64_MAX);
        /* The last holder dies: drained. */
        env_remove(e, D);
        CHECK_EQ(env_count_events(e, P, PROTO_EV_DRAINED), 1);
        CHECK_EQ(state_of(e, buf), PROTO_STATE_IDLE);
        CHECK_EQ(gauges(e).refs, 0);

        /* Death of a consumer of a live buffer just drops its references. */
        other = publish_ok(e, P, (Pub){ .name = "live" });
        C = env_peer(e, 1001, 11, 1);
        attach_ok(e, C, "live");
        env_remove(e, C);
        CHECK_EQ(refs_of(e, other), 0);
        CHECK_EQ(state_of(e, other), PROTO_STATE_LIVE);
        CHECK_EQ(registry_counters(e->r)->peers_removed, 3);
        env_free(e);
}

/* A producer's death revokes its buffers that are not broker-held: holders and subscribers are told, mapped peers
 * hear freed, nothing is left. */
static void test_producer_death_revokes(void)
{
        static const char *const gpu[] = { "GPU-7" };
        Env *e = env_new(NULL);
        RegPeer *P = env_peer(e, 1000, 10, 1), *C1 = env_peer(e, 1001, 11, 1), *C2 = env_peer(e, 1002, 12, 1),
                *S = env_peer(e, 1003, 13, 1), *W = env_peer(e, 1004, 14, 1);
        uint64_t buf, leg, idle, retired, producer;
        Sent *ev;

        env_hello(e, C1, 1, NULL, 1, gpu);
        subscribe(e, S, "");
        buf = publish_ok(e, P, (Pub){ .name = "r/mem" });
        leg = publish_ok(e, P, (Pub){ .name = "r/leg", .kind = PROTO_KIND_CUDA_LEGACY, .device = "GPU-7" });
        idle = publish_ok(e, P, (Pub){ .name = "r/idle" });
        retired = publish_ok(e, P, (Pub){ .name = "r/retired" });
        attach_ok(e, C1, "r/mem");     /* holds it */
        attach_ok(e, C2, "r/mem");     /* maps it, then lets go */
        release(e, C2, buf);
        attach_ok(e, C1, "r/leg");
        attach_ok(e, C2, "r/idle");
        release(e, C2, idle);
        retire(e, P, idle, false);
        attach_ok(e, C1, "r/retired");
        retire(e, P, retired, false);
        CHECK_EQ(state_of(e, idle), PROTO_STATE_IDLE);
        CHECK_EQ(state_of(e, retired), PROTO_STATE_RETIRED);
        attach_name(e, W, "r/next", 1000); /* waits on a name P never published */

        producer = registry_peer_id(P);
        env_remove(e, P);
        /* Holders are told the memory is gone, naming the cause. */
        CHECK_EQ(env_count_events(e, C1, PROTO_EV_REVOKED), 3);
        ev = env_event(e, C1, PROTO_EV_REVOKED);
        CHECK(proto_has(&ev->m, PF_REASON));
        CHECK_EQ(env_why(ev, REG_R_PRODUCER_GONE)->producer_gone.producer.peer, producer);
        CHECK_EQ(ev->why->producer_gone.producer.uid, 1000);
        /* Peers that got the fd are told to drop their mappings; legacy buffers had no fd. */
        CHECK_EQ(env_count_events(e, C1, PROTO_EV_FREED), 2); /* r/mem and r/retired */
        CHECK_EQ(env_count_events(e, C2, PROTO_EV_FREED), 2); /* r/mem and r/idle */
        CHECK_EQ(env_count_events(e, C2, PROTO_EV_REVOKED), 0);
        /* Subscribers hear about every revoked buffer (not about the idle one, which just goes). */
        CHECK_EQ(env_count_events(e, S, PROTO_EV_REVOKED), 3);
        CHECK_EQ(env_count_events(e, W, PROTO_EV_REVOKED), 0);
        CHECK_EQ(gauges(e).buffers, 0);
        CHECK_EQ(gauges(e).refs, 0);
        CHECK_EQ(gauges(e).fds, 0);
        CHECK_EQ(gauges(e).waits, 1); /* the waiter still waits for a future producer */
        CHECK_EQ(registry_counters(e->r)->revokes, 3);
        env_check_status(env_reply(e, C1, attach_name(e, C1, "r/mem", 0)), PROTO_STATUS_NOT_FOUND);
        env_check_status(release(e, C1, buf), PROTO_STATUS_NOT_ATTACHED);
        env_check_status(release(e, C1, leg), PROTO_STATUS_NOT_ATTACHED);
        env_free(e);
}

/* A broker-held buffer outlives its producer: nobody is told, it stays attachable (fd and uid kept), and the
 * producer's uid may manage it. */
/* --max-held-memory-per-uid: a uid's broker-held memory (buffers and segments that carry an fd) is
 * counted where it is registered and given back where it is forgotten; past the limit a publish is
 * quota, saying how much and which flag; memory that is not broker-held, and other uids, are not
 * counted; orphans still count until they are freed. */
static void test_held_memory_quota(void)
{
        Limits l = LIMITS_DEFAULT;
        Env *e;
        RegPeer *P, *C;
        Sent *s;
        uint64_t one;

        l.held_memory_per_uid = 3 * 4096;
        e = env_new(&l);
        P = env_peer(e, 1000, 10, 1);
        C = env_peer(e, 1001, 11, 1);
        one = publish_ok(e, P, (Pub){ .name = "h/1", .held = true });
        publish_ok(e, P, (Pub){ .name = "h/2", .held = true, .size = 8192, .segment_size = 8192 });
        CHECK_EQ(gauges(e).held_memory, 3 * 4096);
        s = publish(e, P, (Pub){ .name = "h/3", .held = true });
        env_check_status(s, PROTO_STATUS_QUOTA);
        CHECK_EQ(env_why(s, REG_E_HELD_MEMORY_LIMIT)->held_memory_limit.held, 3 * 4096);
        CHECK_EQ(s->why->held_memory_limit.limit, 3 * 4096);
        CHECK_EQ(s->why->held_memory_limit.uid, 1000);
        CHECK_EQ(env_held_fds(e), 2); /* the refused fd was closed */
        publish_ok(e, P, (Pub){ .name = "n/1" });    /* not broker-held: not counted */
        publish_ok(e, C, (Pub){ .name = "c/1", .held = true }); /* another uid */
        CHECK_EQ(gauges(e).held_memory, 4 * 4096);
        /* Orphans keep counting: the memory lives on. */
        registry_peer_remove(e->r, P, &e->sink);
        env_flush(e);
        CHECK_EQ(gauges(e).held_memory, 4 * 4096);
        P = env_peer(e, 1000, 12, 1);
        env_check_status(publish(e, P, (Pub){ .name = "h/4", .held = true }), PROTO_STATUS_QUOTA);
        /* Freed (its uid may free an orphan), it is given back. */
        env_check_status(free_buf(e, P, one, false), PROTO_STATUS_OK);
        CHECK_EQ(gauges(e).held_memory, 3 * 4096);
        publish_ok(e, P, (Pub){ .name = "h/4", .held = true });
        CHECK_EQ(gauges(e).held_memory, 4 * 4096);
        env_free(e);
}

static void test_producer_death_broker_held(void)
{
        Env *e = env_new(NULL);
        RegPeer *P = env_peer(e, 1000, 10, 1), *C = env_peer(e, 1001, 11, 1), *C2 = env_peer(e, 1001, 12, 1),
                *X = env_peer(e, 2000, 20, 1), *Q;
        uint64_t buf, quiet;
        Sent *s;

        buf = publish_ok(e, P, (Pub){ .name = "held", .held = true });
        quiet = publish_ok(e, P, (Pub){ .name = "held/quiet", .held = true });
        attach_ok(e, C, "held");
        env_remove(e, P);
        /* Nobody is told anything: the broker keeps the memory. */
        CHECK_EQ(env_count_events(e, C, PROTO_EV_REVOKED), 0);
        CHECK_EQ(env_count_events(e, C, PROTO_EV_FREED), 0);
        CHECK_EQ(gauges(e).orphaned, 2);
        CHECK_EQ(gauges(e).fds, 2);
        CHECK_EQ(state_of(e, buf), PROTO_STATE_LIVE);
        /* Still attachable, by anyone, and the fd still travels. */
        s = attach_ok(e, C2, "held");
        CHECK(s->fd >= 0);
        CHECK_EQ(s->m.owner, 0);
        CHECK_EQ(s->m.uid, 1000);
        /* Its name stays taken. */
        env_check_status(publish(e, C, (Pub){ .name = "held" }), PROTO_STATUS_NAME_TAKEN);

        /* Only a peer of the producer's uid (or an admin) may retire it. */
        env_check_status(retire(e, X, buf, false), PROTO_STATUS_NOT_OWNER);
        env_check_status(free_buf(e, X, buf, false), PROTO_STATUS_NOT_OWNER);
        Q = env_peer(e, 1000, 30, 1);
        env_check_status(retire(e, Q, buf, false), PROTO_STATUS_OK);
        CHECK_EQ(state_of(e, buf), PROTO_STATE_RETIRED);
        CHECK_EQ(env_count_events(e, Q, PROTO_EV_DRAINED), 0); /* drained goes to the owner, and it is gone */
        release(e, C, buf);
        CHECK(registry_buffer_by_id(e->r, buf) != NULL);
        s = release(e, C2, buf);
        env_check_status(s, PROTO_STATUS_OK);
        /* Drained without an owner: destroyed, fd closed, mappings dropped. */
        CHECK(registry_buffer_by_id(e->r, buf) == NULL);
        CHECK_EQ(env_count_events(e, C, PROTO_EV_FREED), 1);
        CHECK_EQ(env_count_events(e, C2, PROTO_EV_FREED), 1);
        CHECK_EQ(gauges(e).fds, 1);

        /* An unreferenced orphan is destroyed by its retire; an admin may do it for any uid. */
        env_check_status(retire(e, X, quiet, true), PROTO_STATUS_OK);
        CHECK(registry_buffer_by_id(e->r, quiet) == NULL);
        CHECK_EQ(gauges(e).fds, 0);
        CHECK_EQ(gauges(e).orphaned, 0);
        env_free(e);
}

/* A broker-held buffer orphaned by its producer's death may be freed by another connection of the producer's uid,
 * and drains only once its consumers let go. */
static void test_broker_held_orphan_by_uid_free(void)
{
        Env *e = env_new(NULL);
        RegPeer *P = env_peer(e, 1000, 10, 1), *C = env_peer(e, 1001, 11, 1), *Q;
        uint64_t buf = publish_ok(e, P, (Pub){ .name = "h", .held = true });

        attach_ok(e, C, "h");
        env_remove(e, P);
        Q = env_peer(e, 1000, 12, 1);
        env_check_status(free_buf(e, Q, buf, false), PROTO_STATUS_OK);
        CHECK_EQ(state_of(e, buf), PROTO_STATE_RETIRED);
        release(e, C, buf);
        CHECK(registry_buffer_by_id(e->r, buf) == NULL);
        /* A retired broker-held buffer whose producer dies drains later, too. */
        P = env_peer(e, 1000, 10, 1);
        buf = publish_ok(e, P, (Pub){ .name = "h2", .held = true });
        attach_ok(e, C, "h2");
        retire(e, P, buf, false);
        env_remove(e, P);
        CHECK_EQ(state_of(e, buf), PROTO_STATE_RETIRED);
        release(e, C, buf);
        CHECK(registry_buffer_by_id(e->r, buf) == NULL);
        env_free(e);
}

/* A restarted producer (same uid) may publish over the name its predecessor left broker-held:
 * the orphan is retired and drains as usual; another uid may not. */
static void test_orphan_takeover(void)
{
        Env *e = env_new(NULL);
        RegPeer *P = env_peer(e, 1000, 10, 1), *C = env_peer(e, 1001, 11, 1), *S = env_peer(e, 1002, 12, 1), *P2;
        uint64_t old, fresh;
        Sent *s;

        old = publish_ok(e, P, (Pub){ .name = "model", .held = true });
        attach_ok(e, C, "model");
        subscribe(e, S, "model");
        env_remove(e, P);
        s = publish(e, C, (Pub){ .name = "model" });
        env_check_status(s, PROTO_STATUS_NAME_TAKEN);
        CHECK_EQ(env_why(s, REG_E_NAME_ORPHANED)->name_orphaned.uid, 1000);
        CHECK_EQ(s->why->name_orphaned.buffer, old);
        P2 = env_peer(e, 1000, 20, 1);
        fresh = publish_ok(e, P2, (Pub){ .name = "model" });
        CHECK(fresh != old);
        CHECK(registry_buffer_by_name(e->r, "model") == registry_buffer_by_id(e->r, fresh));
        CHECK_EQ(state_of(e, old), PROTO_STATE_RETIRED);
        CHECK_EQ(env_count_events(e, S, PROTO_EV_RETIRED), 1);
        CHECK_EQ(env_count_events(e, S, PROTO_EV_PUBLISHED), 1);
        /* The old memory lives until its last holder lets go, then goes (nobody owns it). */
        release(e, C, old);
        CHECK(registry_buffer_by_id(e->r, old) == NULL);
        CHECK_EQ(env_count_events(e, C, PROTO_EV_FREED), 1);
        CHECK_EQ(env_count_events(e, P2, PROTO_EV_DRAINED), 0);
        CHECK_EQ(gauges(e).orphaned, 0);
        /* An unreferenced orphan goes at once. */
        env_remove(e, P2);
        CHECK_EQ(gauges(e).buffers, 0); /* fresh was not broker-held: revoked */
        P = env_peer(e, 1000, 30, 1);
        old = publish_ok(e, P, (Pub){ .name = "model", .held = true });
        env_remove(e, P);
        P = env_peer(e, 1000, 31, 1);
        publish_ok(e, P, (Pub){ .name = "model" });
        CHECK(registry_buffer_by_id(e->r, old) == NULL);
        env_free(e);
}

/* registry_cancel_waits (broker shutdown) answers every pending attach and group join with
 * shutdown, saying the broker is stopping. */
static void test_cancel_waits(void)
{
        Env *e = env_new(NULL);
        RegPeer *A = env_peer(e, 1, 1, 1), *B = env_peer(e, 2, 2, 1), *P = env_peer(e, 3, 3, 1);
        uint64_t w1, w2, j1, j2, j3;
        Sent *s;

        publish_ok(e, P, (Pub){ .name = "there" });
        w1 = attach_name(e, A, "x", 1000);
        w2 = attach_name(e, B, "y", 1000);
        j1 = join(e, A, "g", 3, 1000);
        j2 = join(e, B, "g", 3, 1000);
        j3 = join(e, B, "h", 2, 1000);
        CHECK_EQ(gauges(e).waits, 5);
        registry_cancel_waits(e->r, &e->sink);
        CHECK_EQ(env_flush(e), 5);
        s = env_reply(e, A, w1);
        env_check_status(s, PROTO_STATUS_SHUTDOWN);
        env_why(s, REG_E_STOPPING);
        env_check_status(env_reply(e, B, w2), PROTO_STATUS_SHUTDOWN);
        env_check_status(env_reply(e, A, j1), PROTO_STATUS_SHUTDOWN);
        env_check_status(env_reply(e, B, j2), PROTO_STATUS_SHUTDOWN);
        env_check_status(env_reply(e, B, j3), PROTO_STATUS_SHUTDOWN);
        CHECK_EQ(gauges(e).waits, 0);
        CHECK_EQ(gauges(e).groups, 0);
        CHECK_EQ(gauges(e).names, 1); /* only the published one */
        CHECK_EQ(registry_next_deadline(e->r), UINT64_MAX);
        CHECK_EQ(expire(e, 5000), 0);
        /* Nothing pending: nothing to say. */
        registry_cancel_waits(e->r, &e->sink);
        CHECK_EQ(env_flush(e), 0);
        env_free(e);
}

/* Several peers leaving in one batch (a broker shutting down, or two deaths in one loop turn):
 * frames queued for a peer earlier in the batch go with it, since nobody may look it up after. */
static void test_remove_in_one_batch(void)
{
        Env *e = env_new(NULL);
        RegPeer *P = env_peer(e, 1000, 10, 1), *C = env_peer(e, 1001, 11, 1), *S = env_peer(e, 1002, 12, 1);
        uint64_t buf = publish_ok(e, P, (Pub){ .name = "batch" });

        attach_ok(e, C, "batch");
        subscribe(e, S, "");
        /* P's departure queues a revoke for C and S; then C and S leave before anything is sent. */
        registry_peer_remove(e->r, P, &e->sink);
        CHECK(e->out.n_frames >= 2);
        registry_peer_remove(e->r, C, &e->sink);
        registry_peer_remove(e->r, S, &e->sink);
        for (size_t i = 0; i < e->out.n_frames; i++)
                CHECK(e->out.frames[i].to != P && e->out.frames[i].to != C && e->out.frames[i].to != S);
        CHECK_EQ(env_flush(e), 0);
        CHECK(registry_buffer_by_id(e->r, buf) == NULL);
        CHECK_EQ(gauges(e).peers, 0);
        env_free(e);
}

/* The outbox itself: frames keep their borrowed fd, a message that cannot be encoded costs its
 * peer the connection (it would miss it), close-list fds are closed by outbox_clear. */
static void test_outbox(void)
{
        Env *e = env_new(NULL);
        RegPeer *A = env_peer(e, 1, 1, 1), *B = env_peer(e, 2, 2, 1);
        Outbox o = OUTBOX_INIT;
        ProtoMsg m = { 0 };
        int fd = env_memfd(e, 4096);

        m.event = PROTO_EV_FREED;
        m.has = PROTO_BIT(PF_EVENT);
        CHECK_EQ(outbox_send(&o, A, &m, fd), 0);
        CHECK_EQ(outbox_send(&o, B, &m, -1), 0);
        CHECK_EQ(o.n_frames, 2);
        CHECK_EQ(o.frames[0].fd, fd);
        CHECK_EQ(o.frames[0].frame.data[5], 1); /* the header announces the fd */
        CHECK_EQ(o.frames[1].frame.data[5], 0);
        m.kind = PROTO_KIND_NONE; /* not a valid kind on the wire */
        proto_set(&m, PF_KIND);
        CHECK_EQ(outbox_send(&o, B, &m, -1), -ENOMEM);
        CHECK(registry_peer_lost(B));
        CHECK(!registry_peer_lost(A));
        CHECK_EQ(o.n_frames, 2);
        outbox_close_fd(&o, -1); /* nothing to close */
        CHECK_EQ(o.n_close, 0);
        outbox_drop_peer(&o, A);
        CHECK_EQ(o.n_frames, 1);
        CHECK(o.frames[0].to == B);
        outbox_close_fd(&o, fd);
        outbox_clear(&o);
        CHECK(!env_fd_open(fd));
        CHECK_EQ(o.n_frames, 0);
        CHECK_EQ(o.n_close, 0);
        outbox_deinit(&o);
        CHECK(o.frames == NULL && o.close_fds == NULL);
        e->fds[e->n_fds - 1].closed = true;
        registry_peer_remove(e->r, B, &e->sink); /* a lost peer is disconnected */
        env_remove(e, A);
        env_free(e);
}

/* Only the producer frees; freeing a referenced buffer retires it and forgets it once drained (the producer still
 * hears drained), an unreferenced one goes at once. */
static void test_free_live(void)
{
        Env *e = env_new(NULL);
        RegPeer *P = env_peer(e, 1000, 10, 1), *C = env_peer(e, 1001, 11, 1);
        uint64_t buf = publish_ok(e, P, (Pub){ .name = "f" }), b2;
        Sent *s;

        attach_ok(e, C, "f");
        env_check_status(free_buf(e, C, buf, false), PROTO_STATUS_NOT_OWNER);
        s = free_buf(e, P, buf, false);
        env_check_status(s, PROTO_STATUS_OK);
        /* Freeing a referenced buffer retires it and forgets it once drained. */
        CHECK_EQ(state_of(e, buf), PROTO_STATE_RETIRED);
        CHECK(registry_buffer_by_name(e->r, "f") == NULL);
        CHECK_EQ(gauges(e).fds, 1);
        release(e, C, buf);
        CHECK_EQ(env_count_events(e, P, PROTO_EV_DRAINED), 1); /* the producer still hears drained */
        CHECK(registry_buffer_by_id(e->r, buf) == NULL);
        CHECK_EQ(env_count_events(e, C, PROTO_EV_FREED), 1);
        CHECK_EQ(gauges(e).fds, 0);

        /* An unreferenced live buffer goes at once. */
        b2 = publish_ok(e, P, (Pub){ .name = "f2" });
        env_check_status(free_buf(e, P, b2, false), PROTO_STATUS_OK);
        CHECK(registry_buffer_by_id(e->r, b2) == NULL);
        CHECK_EQ(env_count_events(e, P, PROTO_EV_DRAINED), 1);
        /* A freed-while-retired buffer is not published again. */
        b2 = publish_ok(e, P, (Pub){ .name = "f3" });
        attach_ok(e, C, "f3");
        free_buf(e, P, b2, false);
        env_check_status(publish(e, P, (Pub){ .name = "f3", .buffer = b2 }), PROTO_STATUS_STATE);
        release(e, C, b2);
        env_check_status(publish(e, P, (Pub){ .name = "f3", .buffer = b2 }), PROTO_STATUS_NOT_FOUND);
        env_free(e);
}

/* Each per-peer and per-uid limit (connections, fds, buffers, references, waits, subscriptions) refuses the one
 * over it with quota, saying which limit; another uid has its own budget. */
static void test_quotas(void)
{
        Limits l = LIMITS_DEFAULT;
        Env *e;
        RegPeer *P, *P2, *C, *x = (RegPeer *)0x1;
        PeerCreds creds = { .uid = 5000 };
        Sent *s;
        uint64_t buf;

        l.refs_per_peer = 2;
        l.waits_per_peer = 2;
        l.subs_per_peer = 1;
        l.buffers_per_uid = 2;
        l.fds_per_uid = 1;
        l.connections_per_uid = 2;
        l.connections = 6;
        e = env_new(&l);
        P = env_peer(e, 1000, 10, 1);
        P2 = env_peer(e, 1000, 11, 1);
        C = env_peer(e, 1001, 12, 1);

        /* connections_per_uid: a third connection of uid 1000 is refused (saying why), others are fine. */
        {
                RegWhy why = { REG_WHY_NONE };

                CHECK_EQ(registry_peer_add(e->r, &(PeerCreds){ .uid = 1000 }, 0, NULL, &x, &why),
                         REG_E_CONNECTIONS_PER_UID);
                CHECK_EQ(why.code, REG_E_CONNECTIONS_PER_UID);
                CHECK_EQ(why.connections_per_uid.uid, 1000);
                CHECK_EQ(registry_peer_add(e->r, &(PeerCreds){ .uid = 1000 }, 0, NULL, &x, NULL),
                         REG_E_CONNECTIONS_PER_UID);
        }
        CHECK(x == (RegPeer *)0x1);

        /* fds_per_uid (1) and buffers_per_uid (2), charged to the uid across its peers. */
        buf = publish_ok(e, P, (Pub){ .name = "q/1" });
        s = publish(e, P2, (Pub){ .name = "q/2" });
        env_check_status(s, PROTO_STATUS_QUOTA);
        CHECK_EQ(env_held_fds(e), 1); /* the refused fd was closed */
        publish_ok(e, P2, (Pub){ .name = "q/leg", .kind = PROTO_KIND_CUDA_LEGACY, .device = "GPU-0" });
        env_check_status(publish(e, P2, (Pub){ .name = "q/leg2", .kind = PROTO_KIND_CUDA_LEGACY, .device = "GPU-0" }),
                         PROTO_STATUS_QUOTA);
        /* Another uid has its own budget. */
        publish_ok(e, C, (Pub){ .name = "c/1" });

        /* refs_per_peer (2). */
        attach_ok(e, C, "q/1");
        attach_ok(e, C, "q/1");
        s = env_reply(e, C, attach_name(e, C, "q/1", 0));
        env_check_status(s, PROTO_STATUS_QUOTA);
        CHECK_EQ(refs_of(e, buf), 2);
        release(e, C, buf);
        attach_ok(e, C, "q/1");

        /* waits_per_peer (2), shared by attach waits and group joins. */
        attach_name(e, C, "w/1", 100);
        join(e, C, "grp", 2, 100);
        s = env_reply(e, C, attach_name(e, C, "w/2", 100));
        env_check_status(s, PROTO_STATUS_QUOTA);
        s = env_reply(e, C, join(e, C, "grp2", 2, 100));
        env_check_status(s, PROTO_STATUS_QUOTA);
        expire(e, 100);
        CHECK_EQ(gauges(e).waits, 0);
        attach_name(e, C, "w/3", 100);
        CHECK_EQ(gauges(e).waits, 1);

        /* subs_per_peer (1). */
        env_check_status(subscribe(e, C, "a"), PROTO_STATUS_OK);
        env_check_status(subscribe(e, C, "b"), PROTO_STATUS_QUOTA);
        CHECK_EQ(gauges(e).subs, 1);

        /* connections (6 in all). */
        env_peer(e, 3000, 1, 1);
        env_peer(e, 3001, 1, 1);
        env_peer(e, 3002, 1, 1);
        {
                RegWhy why = { REG_WHY_NONE };

                CHECK_EQ(registry_peer_add(e->r, &creds, 0, NULL, &x, &why), REG_E_CONNECTIONS_LIMIT);
                CHECK_EQ(why.code, REG_E_CONNECTIONS_LIMIT);
                CHECK_EQ(why.connections_limit.limit, 6);
        }
        /* A departure frees the slot, and the uid's buffers stay charged to the uid. */
        env_remove(e, P2);
        CHECK_EQ(registry_peer_add(e->r, &(PeerCreds){ .uid = 1000 }, 0, NULL, &x, NULL), 0);
        CHECK(x != (RegPeer *)0x1);
        env_check_status(publish(e, x, (Pub){ .name = "q/3", .fd_mode = FD_NONE, .kind = PROTO_KIND_CUDA_LEGACY,
                                              .device = "GPU-0" }),
                         PROTO_STATUS_OK); /* q/leg went with P2, so the uid has room again */
        env_free(e);
}

/* A subscription hears events for names under its byte prefix only, one event per matching subscription (tagged
 * with its id), and only its owner may unsubscribe it, once. */
static void test_subscriptions(void)
{
        Env *e = env_new(NULL);
        RegPeer *P = env_peer(e, 1000, 10, 1), *S1 = env_peer(e, 1, 1, 1), *S2 = env_peer(e, 2, 2, 1),
                *S3 = env_peer(e, 3, 3, 1), *C = env_peer(e, 4, 4, 1);
        uint64_t sub1, sub2, sub2b, buf;
        Sent *ev;

        sub1 = subscribe(e, S1, "frames/")->m.sub;
        sub2 = subscribe(e, S2, "")->m.sub;
        sub2b = subscribe(e, S2, "frames/cam")->m.sub;
        env_check_status(subscribe(e, S3, "other"), PROTO_STATUS_OK);
        CHECK(sub1 && sub2 && sub2b && sub1 != sub2 && sub2 != sub2b);
        CHECK_EQ(gauges(e).subs, 4);

        buf = publish_ok(e, P, (Pub){ .name = "frames/cam0" });
        ev = env_event(e, S1, PROTO_EV_PUBLISHED);
        CHECK_EQ(ev->m.sub, sub1);
        CHECK_EQ(ev->m.buffer, buf);
        CHECK(proto_str_eq(ev->m.name, "frames/cam0"));
        CHECK_EQ(ev->m.kind, PROTO_KIND_MEMFD);
        CHECK(ev->m.generation > 0);
        /* One event per matching subscription, even for the same peer. */
        CHECK_EQ(env_count_events(e, S2, PROTO_EV_PUBLISHED), 2);
        CHECK_EQ(env_count_to(e, S3), 0);
        CHECK_EQ(env_count_to(e, C), 0);

        attach_ok(e, C, "frames/cam0");
        CHECK_EQ(env_count_to(e, S1), 0); /* attaches are not events */
        retire(e, P, buf, false);
        CHECK_EQ(env_count_events(e, S1, PROTO_EV_RETIRED), 1);
        CHECK_EQ(env_count_events(e, S1, PROTO_EV_DRAINED), 0);
        release(e, C, buf);
        CHECK_EQ(env_count_events(e, S1, PROTO_EV_DRAINED), 1);
        CHECK_EQ(env_count_events(e, S2, PROTO_EV_DRAINED), 2);

        /* A prefix is a plain byte prefix. */
        publish_ok(e, P, (Pub){ .name = "frames" });
        CHECK_EQ(env_count_to(e, S1), 0);
        CHECK_EQ(env_count_events(e, S2, PROTO_EV_PUBLISHED), 1);

        /* Unsubscribe: own subscriptions only, once. */
        env_check_status(unsubscribe(e, S3, sub1), PROTO_STATUS_NOT_FOUND);
        env_check_status(unsubscribe(e, S1, sub1), PROTO_STATUS_OK);
        env_check_status(unsubscribe(e, S1, sub1), PROTO_STATUS_NOT_FOUND);
        CHECK_EQ(gauges(e).subs, 3);
        publish_ok(e, P, (Pub){ .name = "frames/cam1" });
        CHECK_EQ(env_count_to(e, S1), 0);
        env_free(e);
}

/* A rendezvous group answers nobody until its last member joins, then everyone at once; at the earliest deadline
 * all fail together ("2 of 3"); mismatched counts, zero members and joining twice are refused. */
static void test_groups(void)
{
        Env *e = env_new(NULL);
        RegPeer *A = env_peer(e, 1, 1, 1), *B = env_peer(e, 2, 2, 1), *C = env_peer(e, 3, 3, 1),
                *D = env_peer(e, 4, 4, 1);
        uint64_t ja, jb, jc, jd;
        Sent *s;

        /* Three members: nobody hears anything until the last joins, then everyone at once. */
        e->now = 0;
        ja = join(e, A, "gang", 3, 1000);
        e->now = 100;
        jb = join(e, B, "gang", 3, 500);
        CHECK_EQ(e->n_sent, 0);
        CHECK_EQ(gauges(e).groups, 1);
        CHECK_EQ(registry_next_deadline(e->r), 600); /* the earliest member's deadline */
        jc = join(e, C, "gang", 3, 1000);
        CHECK_EQ(e->n_sent, 3);
        s = env_reply(e, A, ja);
        env_check_status(s, PROTO_STATUS_OK);
        CHECK(proto_str_eq(s->m.group, "gang"));
        CHECK_EQ(s->m.members, 3);
        env_check_status(env_reply(e, B, jb), PROTO_STATUS_OK);
        env_check_status(env_reply(e, C, jc), PROTO_STATUS_OK);
        CHECK_EQ(gauges(e).groups, 0);
        CHECK_EQ(gauges(e).waits, 0);
        CHECK_EQ(registry_next_deadline(e->r), UINT64_MAX);
        CHECK_EQ(registry_counters(e->r)->groups_completed, 1);

        /* Failing together at the earliest deadline. */
        e->now = 1000;
        ja = join(e, A, "late", 3, 1000);
        jb = join(e, B, "late", 3, 200);
        CHECK_EQ(registry_next_deadline(e->r), 1200);
        CHECK_EQ(expire(e, 1199), 0);
        CHECK_EQ(expire(e, 1200), 2);
        s = env_reply(e, A, ja);
        env_check_status(s, PROTO_STATUS_TIMEOUT);
        CHECK_EQ(env_why(s, REG_E_GROUP_TIMEOUT)->group_timeout.joined, 2);
        CHECK_EQ(s->why->group_timeout.members, 3);
        CHECK_STREQ(s->why->group_timeout.group, "late");
        env_check_status(env_reply(e, B, jb), PROTO_STATUS_TIMEOUT);
        CHECK_EQ(gauges(e).groups, 0);
        CHECK_EQ(registry_counters(e->r)->groups_failed, 1);

        /* Mismatched counts, zero members, joining twice. */
        ja = join(e, A, "m", 2, 1000);
        s = env_reply(e, B, join(e, B, "m", 3, 1000));
        env_check_status(s, PROTO_STATUS_GROUP_MISMATCH);
        CHECK_STREQ(env_why(s, REG_E_GROUP_MISMATCH)->group_mismatch.group, "m");
        CHECK_EQ(s->why->group_mismatch.members, 2);
        CHECK_EQ(s->why->group_mismatch.asked, 3);
        env_check_status(env_reply(e, B, join(e, B, "zero", 0, 1000)), PROTO_STATUS_INVALID);
        env_check_status(env_reply(e, A, join(e, A, "m", 2, 1000)), PROTO_STATUS_STATE);
        CHECK_EQ(gauges(e).groups, 1);
        jb = join(e, B, "m", 2, 1000);
        env_check_status(env_reply(e, A, ja), PROTO_STATUS_OK);
        env_check_status(env_reply(e, B, jb), PROTO_STATUS_OK);

        /* A member of one is complete at once. */
        env_check_status(env_reply(e, D, join(e, D, "solo", 1, 10)), PROTO_STATUS_OK);
        CHECK_EQ(gauges(e).groups, 0);

        /* A member leaving: the group waits on, with its deadline re-armed to the remaining ones. */
        e->now = 5000;
        ja = join(e, A, "leave", 3, 100);  /* deadline 5100 */
        jb = join(e, B, "leave", 3, 1000); /* deadline 6000 */
        CHECK_EQ(registry_next_deadline(e->r), 5100);
        env_remove(e, A);
        CHECK_EQ(e->n_sent, 0);
        CHECK_EQ(registry_next_deadline(e->r), 6000);
        CHECK_EQ(expire(e, 5100), 0);
        jc = join(e, C, "leave", 3, 1000);
        jd = join(e, D, "leave", 3, 1000);
        env_check_status(env_reply(e, B, jb), PROTO_STATUS_OK);
        env_check_status(env_reply(e, C, jc), PROTO_STATUS_OK);
        env_check_status(env_reply(e, D, jd), PROTO_STATUS_OK);
        CHECK_EQ(e->n_sent, 3);

        /* Everyone leaving dissolves the group and its timer. */
        jb = join(e, B, "empty", 3, 100);
        jc = join(e, C, "empty", 3, 100);
        env_remove(e, B);
        env_remove(e, C);
        CHECK_EQ(gauges(e).groups, 0);
        CHECK_EQ(registry_next_deadline(e->r), UINT64_MAX);
        CHECK_EQ(expire(e, UINT64_MAX - 1), 0);
        (void)jb;
        (void)jc;
        env_free(e);
}

/* A cuda-legacy attach is refused exactly when producer and consumer have the same PID, each in its
 * own namespace (the kernel's view where the broker has one, else the hello's), as measured on an H100:
 * other namespaces with other PIDs attach, one namespace always does, an unknown PID lets CUDA decide.
 * The refusal names the PID and both fixes, takes no reference, and leaves the buffer attachable. */
static void test_legacy_same_pid(void)
{
        static const char *const gpu[] = { "GPU-aa" };
        Env *e = env_new(NULL);
        /* The producer: PID 10 of the broker's own namespace 111. */
        RegPeer *P = env_peer_ns(e, 1000, 10, 111, 10), *Csame = env_peer_ns(e, 1001, 11, 111, 11),
                *Cchild = env_peer_ns(e, 1002, 12, 222, 10),  /* a namespace below, where it is PID 10 too */
                *Cchild2 = env_peer_ns(e, 1002, 13, 333, 5),  /* a namespace below, PID 5 */
                *Cout = env_peer_ns(e, 1004, 0, 0, 0),        /* not shown by the kernel: declares PID 10 */
                *Cout2 = env_peer_ns(e, 1004, 0, 0, 0),       /* declares PID 3 */
                *Cunknown = env_peer_ns(e, 1005, 0, 0, 0);    /* declares nothing */
        Sent *s;

        env_hello(e, P, 111, "producer", 1, gpu);
        env_hello(e, Csame, 111, "same", 1, gpu);
        env_hello(e, Cchild, 222, "child", 1, gpu);
        env_hello(e, Cchild2, 333, "child2", 1, gpu);
        env_hello_self(e, Cout, 10, 444, 0, 0, gpu);
        env_hello_self(e, Cout2, 3, 444, 0, 0, gpu);
        env_hello_self(e, Cunknown, 0, 0, 0, 0, gpu);
        publish_ok(e, P, (Pub){ .name = "leg", .kind = PROTO_KIND_CUDA_LEGACY, .device = "GPU-aa" });
        publish_ok(e, P, (Pub){ .name = "vmm", .kind = PROTO_KIND_CUDA_VMM, .device = "GPU-aa" });

        attach_ok(e, Csame, "leg");
        s = env_reply(e, Cchild, attach_name(e, Cchild, "leg", 0));
        env_check_status(s, PROTO_STATUS_SAME_PID);
        CHECK_STREQ(env_why(s, REG_E_SAME_PID)->same_pid.name, "leg");
        CHECK_EQ(s->why->same_pid.pid, 10);
        CHECK_EQ(s->why->same_pid.producer_uid, 1000);
        /* both PIDs are the kernel's */
        CHECK(!s->why->same_pid.producer_declared && !s->why->same_pid.consumer_declared);
        CHECK_EQ(gauges(e).refs, 1);
        /* Another namespace with another PID: the configuration the old rule refused works. */
        attach_ok(e, Cchild2, "leg");
        s = env_reply(e, Cout, attach_name(e, Cout, "leg", 0));
        env_check_status(s, PROTO_STATUS_SAME_PID);
        CHECK_EQ(env_why(s, REG_E_SAME_PID)->same_pid.pid, 10);
        CHECK(s->why->same_pid.consumer_declared);
        attach_ok(e, Cout2, "leg");
        /* Nothing known: no diagnosis, CUDA has its say. */
        attach_ok(e, Cunknown, "leg");
        /* cuda-vmm crosses anything. */
        attach_ok(e, Cchild, "vmm");
        attach_ok(e, Cout, "vmm");
        /* The refusals took nothing and left the buffer as it was. */
        CHECK_EQ(gauges(e).refs, 6);
        CHECK_EQ(gauges(e).live, 2);
        env_free(e);
}

/* The pod case: producer and consumer are each PID 1 of a container the broker cannot see into; what
 * they declared is all there is, and the listing shows it with their /dev/shm. */
static void test_legacy_same_pid_declared(void)
{
        static const char *const gpu[] = { "GPU-aa" };
        Env *e = env_new(NULL);
        RegPeer *P = env_peer_ns(e, 1000, 0, 0, 0), *C = env_peer_ns(e, 1001, 0, 0, 0),
                *V = env_peer_ns(e, 1002, 12, 111, 12);
        ProtoMsg m;
        Sent *s;

        env_hello_self(e, P, 1, 4026532201u, 25, 1, gpu);
        env_hello_self(e, C, 1, 4026532305u, 26, 1, gpu);
        env_hello(e, V, 111, "visible", 1, gpu);
        publish_ok(e, P, (Pub){ .name = "leg", .kind = PROTO_KIND_CUDA_LEGACY, .device = "GPU-aa" });
        s = env_reply(e, C, attach_name(e, C, "leg", 0));
        env_check_status(s, PROTO_STATUS_SAME_PID);
        CHECK_EQ(env_why(s, REG_E_SAME_PID)->same_pid.pid, 1);
        CHECK(s->why->same_pid.producer_declared && s->why->same_pid.consumer_declared);
        CHECK_EQ(s->why->same_pid.producer_uid, 1000);
        /* The producer's own PID travels with a legacy attach, for the consumer's diagnosis. */
        s = env_reply(e, V, attach_name(e, V, "leg", 0));
        env_check_status(s, PROTO_STATUS_OK);
        CHECK(proto_has(&s->m, PF_SELF_PID));
        CHECK_EQ(s->m.self_pid, 1);
        /* Listings: the PID each sees for itself, the kernel's where known, and the declared /dev/shm. */
        reply_peer_describe(C, &m);
        CHECK(m.pidns_declared);
        CHECK_EQ(m.self_pid, 1);
        CHECK_EQ(m.shm_dev, 26);
        CHECK_EQ(m.shm_ino, 1);
        reply_peer_describe(V, &m);
        CHECK_EQ(m.self_pid, 12);
        CHECK(!proto_has(&m, PF_SHM_DEV));
        env_free(e);
}

/* A producer the broker cannot see (pid 0) has no pid worth printing: peers listings mark
 * namespaces that are only what a peer declared. */
static void test_pidns_declared_in_listings(void)
{
        static const char *const gpu[] = { "GPU-aa" };
        Env *e = env_new(NULL);
        RegPeer *C = env_peer(e, 1001, 11, 111), *D = env_peer(e, 1002, 12, 0);
        ProtoMsg m;

        env_hello(e, C, 111, "inside", 1, gpu);
        env_hello(e, D, 333, "declared", 1, gpu);
        reply_peer_describe(C, &m);
        CHECK(!m.pidns_declared && proto_has(&m, PF_PIDNS_DECLARED));
        reply_peer_describe(D, &m);
        CHECK(m.pidns_declared);
        CHECK_EQ(m.pidns, 333);
        env_free(e);
}

/* Attaching a CUDA buffer from a consumer that did not declare the producer's GPU fails saying which GPUs each side
 * has; memfd ignores devices. */
static void test_device_diagnosis(void)
{
        static const char *const theirs[] = { "GPU-bbbb", "MIG-cccc" };
        static const char *const mine[] = { "GPU-bbbb", "GPU-aaaa" };
        char many_store[PROTO_MAX_GPUS][PROTO_MAX_UUID + 1];
        const char *many[PROTO_MAX_GPUS];
        Env *e = env_new(NULL);
        RegPeer *P = env_peer(e, 1000, 10, 1), *C = env_peer(e, 1001, 11, 1), *N = env_peer(e, 1002, 12, 1),
                *G = env_peer(e, 1003, 13, 1), *M = env_peer(e, 1004, 14, 1);
        Sent *s;

        env_hello(e, C, 1, "c", 2, theirs);
        env_hello(e, G, 1, "g", 2, mine);
        for (unsigned i = 0; i < PROTO_MAX_GPUS; i++) {
                memset(many_store[i], 'a' + i % 26, PROTO_MAX_UUID);
                many_store[i][PROTO_MAX_UUID] = 0;
                memcpy(many_store[i], "GPU-", 4);
                many[i] = many_store[i];
        }
        env_hello(e, M, 1, "m", PROTO_MAX_GPUS, many);
        publish_ok(e, P, (Pub){ .name = "on-a", .kind = PROTO_KIND_CUDA_VMM, .device = "GPU-aaaa" });
        publish_ok(e, P, (Pub){ .name = "leg-a", .kind = PROTO_KIND_CUDA_LEGACY, .device = "GPU-aaaa" });
        publish_ok(e, P, (Pub){ .name = "mem", .device = "GPU-aaaa" });

        s = env_reply(e, C, attach_name(e, C, "on-a", 0));
        env_check_status(s, PROTO_STATUS_DEVICE);
        CHECK_STREQ(env_why(s, REG_E_DEVICE)->device.device, "GPU-aaaa");
        CHECK_STREQ(s->why->device.name, "on-a");
        CHECK_EQ(s->why->device.n_gpus, 2);
        CHECK_STREQ(s->why->device.gpus[0], "GPU-bbbb");
        CHECK_STREQ(s->why->device.gpus[1], "MIG-cccc");
        env_check_status(env_reply(e, C, attach_name(e, C, "leg-a", 0)), PROTO_STATUS_DEVICE);
        /* No hello, no GPUs. */
        s = env_reply(e, N, attach_name(e, N, "on-a", 0));
        env_check_status(s, PROTO_STATUS_DEVICE);
        CHECK_EQ(env_why(s, REG_E_DEVICE)->device.n_gpus, 0);
        /* A long list is cut to fit the message, and the reply still encodes. */
        s = env_reply(e, M, attach_name(e, M, "on-a", 0));
        env_check_status(s, PROTO_STATUS_DEVICE);
        CHECK(s->m.message.len <= PROTO_MAX_TEXT);
        /* The right GPU among several. */
        attach_ok(e, G, "on-a");
        attach_ok(e, G, "leg-a");
        /* memfd ignores devices. */
        attach_ok(e, N, "mem");
        CHECK_EQ(gauges(e).refs, 3);
        env_free(e);
}

/* A peer says hello once; its label, GPUs and declared PID namespace are kept (the kernel's namespace wins), and an
 * over-long label is cut. */
static void test_hello(void)
{
        static const char *const gpus[] = { "GPU-1", "GPU-2" };
        Env *e = env_new(NULL);
        RegPeer *p = env_peer(e, 1000, 10, 99);
        PeerHello h = { .pid = 1, .pidns = 5, .label = "again" };
        ProtoMsg m;
        char label[100];

        CHECK(!registry_peer_said_hello(p));
        env_hello(e, p, 5, "camera-producer", 2, gpus);
        CHECK_EQ(registry_peer_hello(e->r, p, &h, NULL), REG_E_HELLO_AGAIN);
        reply_peer_describe(p, &m);
        CHECK(proto_str_eq(m.label, "camera-producer"));
        CHECK_EQ(m.n_gpus, 2);
        CHECK(proto_str_eq(m.gpus[1], "GPU-2"));
        CHECK_EQ(m.pidns, 99); /* the kernel's view beats the declared one */
        CHECK_EQ(m.uid, 1000);
        CHECK_EQ(m.pid, 10);
        /* An over-long label is cut to PROTO_MAX_LABEL. */
        memset(label, 'l', sizeof(label) - 1);
        label[sizeof(label) - 1] = 0;
        p = env_peer(e, 1000, 11, 0);
        env_hello(e, p, 42, label, 0, NULL);
        reply_peer_describe(p, &m);
        CHECK_EQ(m.label.len, PROTO_MAX_LABEL);
        CHECK_EQ(m.pidns, 42);
        CHECK_EQ(registry_peer_creds(p)->pid, 11);
        CHECK(registry_peer_userdata(p) == NULL);
        CHECK(!registry_peer_lost(p));
        registry_peer_mark_lost(p);
        CHECK(registry_peer_lost(p));
        registry_peer_mark_lost(NULL);
        env_remove(e, p);
        registry_peer_remove(e->r, NULL, &e->sink); /* NULL-safe */
        CHECK_EQ(env_flush(e), 0);
        env_free(e);
}

/* ---- broker restarts: restored buffers, reclaims, the grace ---- */

static Env *env_new_grace(uint32_t grace_ms)
{
        Env *e = calloc(1, sizeof(*e));

        CHECK(e);
        env_init_cfg(e, (RegConfig){ .limits = LIMITS_DEFAULT, .id_seed = 1, .first_generation = 100,
                                     .restart_grace_ms = grace_ms });
        return e;
}

typedef struct Rec {
        uint64_t buffer, generation;
        uint32_t refs, uid;
        const char *name;
} Rec;

static Sent *reclaim(Env *e, RegPeer *p, Rec o)
{
        RegReclaim a = { .buffer = o.buffer, .generation = o.generation, .refs = o.refs,
                         .owner_uid = o.uid, .name = o.name, .kind = PROTO_KIND_MEMFD };
        uint64_t id = next_req++;

        ENV_DO(e, p, id, registry_reclaim, &a);
        env_flush(e);
        return env_reply(e, p, id);
}

/* What the registry says, before any frame: what an operation returned (a failure's code, its facts
 * in why) and a sink that keeps the changes it emitted (the strings they borrow are not read: they
 * may be gone once the operation returns). */
typedef struct Said {
        int result;
        RegWhy why;
        RegChange c[8];
        size_t n;
} Said;

static void keep_change(void *ctx, const RegChange *c)
{
        Said *said = ctx;

        CHECK(said->n < 8);
        said->c[said->n] = *c;
        said->n++;
}

static Said reclaim_said(Env *e, RegPeer *p, Rec o)
{
        RegReclaim a = { .buffer = o.buffer, .generation = o.generation, .refs = o.refs,
                         .owner_uid = o.uid, .name = o.name, .kind = PROTO_KIND_MEMFD };
        Said said = { .n = 0 };
        RegSink sink = { keep_change, &said };

        said.result = registry_reclaim(e->r, p, &a, &said.why, &sink);
        return said;
}

/* A reclaim's results as the registry states them: a peer that never attached gets what an attach
 * would give (retire_after counts its references, and says how far it would pass), and the reply
 * of a granted one carries the buffer's state; an id nobody knows is refused with the id. */
static void test_reclaim_results(void)
{
        Env *e = env_new(NULL);
        RegPeer *P = env_peer(e, 1000, 10, 1), *C = env_peer(e, 1001, 11, 1);
        uint64_t buf, gen;
        Said said;

        buf = publish_ok(e, P, (Pub){ .name = "said/once", .retire_after = 1 });
        gen = env_reply(e, P, next_req - 1)->m.generation;

        said = reclaim_said(e, C, (Rec){ buf, gen, 5, 1000, "said/once" });
        CHECK_EQ(said.n, 0); /* a failure changes nothing */
        CHECK_EQ(said.result, REG_E_CLAIM_RETIRE_AFTER);
        CHECK_EQ(said.why.code, REG_E_CLAIM_RETIRE_AFTER);
        CHECK_EQ(reply_status(said.why.code), PROTO_STATUS_REVOKED);
        CHECK_EQ(said.why.claim_retire_after.buffer, buf);
        CHECK_EQ(said.why.claim_retire_after.retire_after, 1);
        CHECK_EQ(said.why.claim_retire_after.attaches, 0);
        CHECK_EQ(said.why.claim_retire_after.unvouched, 5); /* references nobody vouches for */
        CHECK_EQ(refs_of(e, buf), 0);

        said = reclaim_said(e, C, (Rec){ buf, gen, 1, 1000, "said/once" });
        CHECK_EQ(said.result, 0);
        CHECK_EQ(said.n, 1);
        CHECK_EQ(said.c[0].type, REG_CH_RESULT);
        CHECK_EQ(said.c[0].reply, REG_RE_STATE);
        CHECK_EQ(said.c[0].n, PROTO_STATE_LIVE); /* the reply first; it retires right after */
        CHECK_EQ(refs_of(e, buf), 1);
        CHECK(registry_buffer_by_name(e->r, "said/once") == NULL);

        said = reclaim_said(e, C, (Rec){ 424242, 1, 1, 1000, "said/none" });
        CHECK_EQ(said.result, REG_E_CLAIM_UNKNOWN);
        CHECK_EQ(said.why.claim_unknown.buffer, 424242);
        env_free(e);
}

/* A producer registers a retired buffer again after a restart; its holders come back and release:
 * drained waits for the end of the grace, and says holders came back. */
static void test_restored_retired_waits_for_grace(void)
{
        Env *e = env_new_grace(1000);
        RegPeer *P = env_peer(e, 1000, 10, 1), *C = env_peer(e, 1001, 11, 1);
        Sent *s;

        CHECK(registry_in_grace(e->r));
        CHECK_EQ(registry_next_deadline(e->r), 1000);
        s = publish(e, P, (Pub){ .name = "r/frame", .key = 500, .restored = true, .generation = 7, .retired = true });
        env_check_status(s, PROTO_STATUS_OK);
        CHECK_EQ(s->m.buffer, 500);
        CHECK_EQ(s->m.generation, 7); /* the generation its consumers know it by */
        CHECK_EQ(s->m.state, PROTO_STATE_RETIRED);
        CHECK(registry_buffer_by_name(e->r, "r/frame") == NULL); /* registered, not published */
        CHECK_EQ(env_count_events(e, P, PROTO_EV_DRAINED), 0);  /* nobody reclaimed it yet */
        CHECK_EQ(gauges(e).restored, 1);

        s = reclaim(e, C, (Rec){ 500, 7, 2, 1000, "r/frame" });
        env_check_status(s, PROTO_STATUS_OK);
        CHECK(!proto_has(&s->m, PF_PENDING));
        CHECK_EQ(refs_of(e, 500), 2);
        release(e, C, 500);
        release(e, C, 500);
        CHECK_EQ(env_count_events(e, P, PROTO_EV_DRAINED), 0); /* others may still come back */
        CHECK_EQ(state_of(e, 500), PROTO_STATE_RETIRED);

        expire(e, 999);
        CHECK_EQ(env_count_events(e, P, PROTO_EV_DRAINED), 0);
        expire(e, 1000);
        s = env_event(e, P, PROTO_EV_DRAINED);
        CHECK_EQ(env_why(s, REG_R_RESTART_RELEASED)->restart_released.came_back, 1);
        CHECK_EQ(s->why->restart_released.grace_ms, 1000);
        CHECK_EQ(state_of(e, 500), PROTO_STATE_IDLE);
        CHECK(!registry_in_grace(e->r));
        CHECK_EQ(gauges(e).restored, 0);
        CHECK_EQ(registry_next_deadline(e->r), UINT64_MAX);
        env_free(e);
}

/* A consumer back before its producer: the claim waits, then becomes references of the restored
 * buffer; a claim for another publication of the same id is revoked instead. */
static void test_claims_wait_for_their_producer(void)
{
        Env *e = env_new_grace(1000);
        RegPeer *P = env_peer(e, 1000, 10, 1), *C = env_peer(e, 1001, 11, 1), *D = env_peer(e, 1002, 12, 1);
        ProtoMsg m;
        Sent *s;

        s = reclaim(e, C, (Rec){ 600, 9, 3, 1000, "w/frame" });
        env_check_status(s, PROTO_STATUS_OK);
        CHECK(proto_has(&s->m, PF_PENDING) && s->m.pending);
        s = reclaim(e, D, (Rec){ 600, 8, 1, 1000, "w/frame" }); /* an older publication */
        CHECK(s->m.pending);
        CHECK_EQ(gauges(e).claims_pending, 2);
        CHECK_EQ(gauges(e).refs, 0); /* claims are not references yet */
        reply_peer_describe(C, &m);
        CHECK_EQ(m.refs, 0);

        s = publish(e, P, (Pub){ .name = "w/frame", .key = 600, .restored = true, .generation = 9 });
        env_check_status(s, PROTO_STATUS_OK);
        CHECK_EQ(s->m.state, PROTO_STATE_LIVE);
        CHECK_EQ(gauges(e).claims_pending, 0);
        CHECK_EQ(refs_of(e, 600), 3);
        s = env_event(e, D, PROTO_EV_REVOKED);
        CHECK_EQ(env_why(s, REG_E_CLAIM_REPUBLISHED)->claim_republished.generation, 9);
        CHECK_EQ(s->why->claim_republished.held_generation, 8);
        CHECK_EQ(s->m.buffer, 600);
        CHECK_EQ(env_count_events(e, C, PROTO_EV_REVOKED), 0);
        /* C's references are real ones, and it has the memory mapped: no fd on its next attach. */
        s = attach_ok(e, C, "w/frame");
        CHECK(s->m.cached && s->fd < 0);
        env_free(e);
}

/* Claims whose producer never comes back are revoked when the grace ends; a reclaim after it
 * for an unknown id is refused at once. */
static void test_claims_revoked_at_grace_end(void)
{
        Env *e = env_new_grace(500);
        RegPeer *C = env_peer(e, 1001, 11, 1);
        Sent *s;

        reclaim(e, C, (Rec){ 700, 3, 1, 1000, "gone/frame" });
        expire(e, 500);
        s = env_event(e, C, PROTO_EV_REVOKED);
        CHECK_EQ(s->m.buffer, 700);
        CHECK_EQ(s->m.generation, 3);
        env_why(s, REG_R_CLAIM_GRACE_OVER);
        CHECK_EQ(gauges(e).claims_pending, 0);
        env_check_status(reclaim(e, C, (Rec){ 701, 3, 1, 1000, "gone/other" }), PROTO_STATUS_REVOKED);
        env_free(e);
}

/* Without a restart: a reclaim succeeds for the same, undrained publication only. A consumer whose
 * connection dropped may take its reference back while the buffer is live or still retired, never
 * once it drained (its memory may be in use again) or was published anew. */
static void test_reclaim_only_the_same_publication(void)
{
        Env *e = env_new(NULL);
        RegPeer *P = env_peer(e, 1000, 10, 1), *C = env_peer(e, 1001, 11, 1), *D = env_peer(e, 1002, 12, 1);
        uint64_t buf, gen;
        Sent *s;

        buf = publish_ok(e, P, (Pub){ .name = "same" });
        gen = env_reply(e, P, next_req - 1)->m.generation;
        attach_ok(e, D, "same");
        env_check_status(reclaim(e, C, (Rec){ buf, gen, 1, 1000, "same" }), PROTO_STATUS_OK);
        env_check_status(reclaim(e, C, (Rec){ buf, gen + 1, 1, 1000, "same" }), PROTO_STATUS_REVOKED);
        env_check_status(reclaim(e, C, (Rec){ buf, gen, 1, 1001, "same" }), PROTO_STATUS_REVOKED);
        env_check_status(reclaim(e, C, (Rec){ buf, gen, 1, 1000, "other" }), PROTO_STATUS_REVOKED);
        retire(e, P, buf, false);
        /* Retired: an attach would grant nothing, and no connection of uid 1001 held it when it ended. */
        s = reclaim(e, C, (Rec){ buf, gen, 1, 1000, "same" });
        env_check_status(s, PROTO_STATUS_REVOKED);
        CHECK_EQ(env_why(s, REG_E_CLAIM_RETIRED)->claim_retired.buffer, buf);
        CHECK_EQ(s->why->claim_retired.uid, 1001);
        /* C's connection ends holding one: the broker vouches for it, once, to the next peer of its uid. */
        env_remove(e, C);
        C = env_peer(e, 1001, 13, 1);
        env_check_status(reclaim(e, C, (Rec){ buf, gen, 1, 1000, "same" }), PROTO_STATUS_OK); /* not drained */
        env_check_status(reclaim(e, C, (Rec){ buf, gen, 1, 1000, "same" }), PROTO_STATUS_REVOKED);
        CHECK_EQ(refs_of(e, buf), 2);
        release(e, C, buf);
        release(e, D, buf);
        CHECK_EQ(env_count_events(e, P, PROTO_EV_DRAINED), 1);
        s = reclaim(e, C, (Rec){ buf, gen, 1, 1000, "same" });
        env_check_status(s, PROTO_STATUS_REVOKED);
        CHECK_EQ(env_why(s, REG_E_CLAIM_DRAINED)->claim_drained.buffer, buf);
        /* No grace here: unknown ids are refused at once. */
        env_check_status(reclaim(e, C, (Rec){ 999999, 1, 1, 1000, "same" }), PROTO_STATUS_REVOKED);
        env_check_status(reclaim(e, C, (Rec){ buf, gen, 0, 1000, "same" }), PROTO_STATUS_INVALID);
        env_free(e);
}

/* Ids are the producer's: one in use is refused (key-taken), a forgotten one may serve again; a
 * producer that lost its connection adopts its broker-held orphan back under its id, holders and
 * all. */
static void test_ids_keys_and_adoption(void)
{
        Env *e = env_new_grace(1000);
        RegPeer *P = env_peer(e, 1000, 10, 1), *C = env_peer(e, 1001, 11, 1), *X = env_peer(e, 2000, 20, 1), *P2;
        uint64_t gen;
        Sent *s;

        s = publish(e, P, (Pub){ .name = "k/one", .key = 42, .held = true });
        env_check_status(s, PROTO_STATUS_OK);
        CHECK_EQ(s->m.buffer, 42);
        gen = s->m.generation;
        CHECK(gen > 100); /* generations count from first_generation */
        env_check_status(publish(e, X, (Pub){ .name = "k/two", .key = 42 }), PROTO_STATUS_KEY_TAKEN);
        attach_ok(e, C, "k/one");
        env_remove(e, P);
        CHECK_EQ(gauges(e).orphaned, 1);

        /* Another uid cannot take it over by its id. */
        env_check_status(publish(e, X, (Pub){ .name = "k/one", .key = 42, .restored = true, .generation = gen }),
                         PROTO_STATUS_KEY_TAKEN);
        /* Its producer's uid, registering it again as the same publication, adopts it. */
        P2 = env_peer(e, 1000, 30, 1);
        env_check_status(publish(e, P2, (Pub){ .name = "k/one", .key = 42, .restored = true, .generation = gen - 1 }),
                         PROTO_STATUS_KEY_TAKEN);
        s = publish(e, P2, (Pub){ .name = "k/one", .key = 42, .restored = true, .generation = gen });
        env_check_status(s, PROTO_STATUS_OK);
        CHECK_EQ(s->m.state, PROTO_STATE_LIVE);
        CHECK_EQ(gauges(e).orphaned, 0);
        CHECK_EQ(refs_of(e, 42), 1);
        CHECK_EQ(gauges(e).fds, 1); /* the broker kept its own fd and closed the new one */
        retire(e, P2, 42, false);
        release(e, C, 42);
        CHECK_EQ(env_count_events(e, P2, PROTO_EV_DRAINED), 1); /* adopted, not restored: no grace */
        free_buf(e, P2, 42, false);
        /* Forgotten, so the id is free again. */
        env_check_status(publish(e, X, (Pub){ .name = "k/three", .key = 42 }), PROTO_STATUS_OK);
        /* A restored generation must come from an earlier broker (at most the current counter). */
        env_check_status(publish(e, X, (Pub){ .name = "k/four", .key = 43, .restored = true, .generation = 1u << 30 }),
                         PROTO_STATUS_INVALID);
        env_free(e);
}

/* A restored live buffer whose name another producer took meanwhile comes back retired: holders can
 * still reclaim it, and it drains when they are done. */
static void test_restored_name_taken_registers_retired(void)
{
        Env *e = env_new_grace(1000);
        RegPeer *P = env_peer(e, 1000, 10, 1), *Q = env_peer(e, 1001, 11, 1), *C = env_peer(e, 1002, 12, 1);
        Sent *s;

        publish_ok(e, Q, (Pub){ .name = "t/frame" });
        s = publish(e, P, (Pub){ .name = "t/frame", .key = 800, .restored = true, .generation = 5 });
        env_check_status(s, PROTO_STATUS_OK);
        CHECK_EQ(s->m.state, PROTO_STATE_RETIRED);
        env_check_status(reclaim(e, C, (Rec){ 800, 5, 1, 1000, "t/frame" }), PROTO_STATUS_OK);
        expire(e, 1000);
        CHECK_EQ(env_count_events(e, P, PROTO_EV_DRAINED), 0);
        release(e, C, 800);
        CHECK_EQ(env_count_events(e, P, PROTO_EV_DRAINED), 1);
        env_free(e);
}

static void count_holder(const RegPeer *p, uint32_t refs, void *ud)
{
        (void)p;
        *(uint64_t *)ud += refs;
}

/* The registry's views list buffers in registration order (cursors are positions; producer-chosen ids say nothing
 * of order) and peers in id order, each describing what it owns. */
static void test_views(void)
{
        Env *e = env_new(NULL);
        RegPeer *P = env_peer(e, 1000, 10, 1), *C = env_peer(e, 1001, 11, 1), *p;
        uint64_t ids[5], cur[5], refs = 0;
        ProtoMsg m;
        RegBuffer *b;
        unsigned n;

        for (unsigned i = 0; i < 5; i++) {
                char name[16];
                snprintf(name, sizeof(name), "v/%u", i);
                /* Ids are the producer's choice (here descending) or random: they say nothing of order. */
                ids[i] = publish_ok(e, P, (Pub){ .name = name, .key = i < 3 ? 1000 - i : 0 });
                cur[i] = registry_buffer_cursor(registry_buffer_by_id(e->r, ids[i]));
        }
        CHECK_EQ(ids[0], 1000);
        CHECK_EQ(ids[2], 998);
        /* Buffers in registration order; after() starts above a cursor, present or not. */
        n = 0;
        for (b = registry_buffer_after(e->r, 0); b; b = registry_buffer_next(e->r, b)) {
                reply_buffer_describe(b, &m);
                CHECK_EQ(m.buffer, ids[n]);
                CHECK(n == 0 || registry_buffer_cursor(b) > cur[n - 1]);
                n++;
        }
        CHECK_EQ(n, 5);
        CHECK(registry_buffer_after(e->r, cur[1]) == registry_buffer_by_id(e->r, ids[2]));
        CHECK(registry_buffer_after(e->r, cur[4]) == NULL);
        free_buf(e, P, ids[2], false);
        CHECK(registry_buffer_after(e->r, cur[1]) == registry_buffer_by_id(e->r, ids[3]));
        CHECK(registry_buffer_after(e->r, cur[2]) == registry_buffer_by_id(e->r, ids[3]));
        CHECK_STREQ(registry_buffer_name(registry_buffer_by_id(e->r, ids[3])), "v/3");
        CHECK(registry_buffer_by_name(e->r, "v/9") == NULL);

        attach_ok(e, C, "v/0");
        attach_ok(e, C, "v/0");
        registry_buffer_holders(registry_buffer_by_id(e->r, ids[0]), count_holder, &refs);
        CHECK_EQ(refs, 2);

        /* Peers in id order, each describing what it owns. */
        p = registry_peer_first(e->r);
        CHECK(p == P);
        reply_peer_describe(p, &m);
        CHECK_EQ(m.buffers, 4);
        p = registry_peer_next(e->r, p);
        CHECK(p == C);
        reply_peer_describe(p, &m);
        CHECK_EQ(m.refs, 2);
        CHECK(registry_peer_next(e->r, p) == NULL);
        CHECK_EQ(registry_counters(e->r)->publishes, 5);
        CHECK_EQ(registry_counters(e->r)->attaches, 2);
        CHECK_EQ(registry_counters(e->r)->peers_added, 2);
        env_free(e);
}

/* Bytes shared (buffer memory registered) and held (each buffer once per peer holding a reference),
 * in all and per uid, follow publishes, attaches, releases, a holder's departure and a free, to the
 * byte. (env_check compares the totals with the buffers' descriptions after every operation.) */
static void test_bytes_shared_and_held(void)
{
        Env *e = env_new(NULL);
        RegPeer *P = env_peer(e, 1000, 10, 1), *C = env_peer(e, 1001, 11, 1), *D = env_peer(e, 1002, 12, 1);
        uint64_t a, b, shared, held;
        RegGauges g;

        a = publish_ok(e, P, (Pub){ .name = "m/a" });
        b = publish_ok(e, P, (Pub){ .name = "m/b" });
        g = gauges(e);
        CHECK_EQ(g.shared_bytes[PROTO_KIND_MEMFD], 8192);
        CHECK_EQ(g.held_bytes[PROTO_KIND_MEMFD], 0);
        CHECK_EQ(g.shared_bytes[PROTO_KIND_CUDA_VMM], 0);
        registry_uid_bytes(e->r, 1000, &shared, &held);
        CHECK_EQ(shared, 8192);
        CHECK_EQ(held, 0);

        attach_ok(e, C, "m/a");
        attach_ok(e, C, "m/a"); /* a second reference: the same bytes */
        attach_ok(e, D, "m/a");
        attach_ok(e, D, "m/b");
        g = gauges(e);
        CHECK_EQ(g.held_bytes[PROTO_KIND_MEMFD], 3 * 4096);
        registry_uid_bytes(e->r, 1001, &shared, &held);
        CHECK_EQ(shared, 0);
        CHECK_EQ(held, 4096);
        registry_uid_bytes(e->r, 1002, &shared, &held);
        CHECK_EQ(held, 8192);

        env_check_status(release(e, C, a), PROTO_STATUS_OK);
        CHECK_EQ(gauges(e).held_bytes[PROTO_KIND_MEMFD], 3 * 4096); /* one reference left */
        env_check_status(release(e, C, a), PROTO_STATUS_OK);
        CHECK_EQ(gauges(e).held_bytes[PROTO_KIND_MEMFD], 2 * 4096);
        registry_uid_bytes(e->r, 1001, &shared, &held);
        CHECK_EQ(held, 0);

        registry_peer_remove(e->r, D, &e->sink);
        env_flush(e);
        CHECK_EQ(gauges(e).held_bytes[PROTO_KIND_MEMFD], 0);
        registry_uid_bytes(e->r, 1002, &shared, &held);
        CHECK_EQ(held, 0);

        env_check_status(free_buf(e, P, b, false), PROTO_STATUS_OK);
        CHECK_EQ(gauges(e).shared_bytes[PROTO_KIND_MEMFD], 4096);
        registry_uid_bytes(e->r, 1000, &shared, &held);
        CHECK_EQ(shared, 4096);
        registry_uid_bytes(e->r, 4242, &shared, &held); /* a uid the broker never saw */
        CHECK_EQ(shared, 0);
        CHECK_EQ(held, 0);
        env_free(e);
}

/* Every fd handed to the registry ends up closed exactly once, in every way a buffer can end. */
/* Views: ranges of a segment published as buffers of their own. The segment's fd travels with the
 * first view (once) and to each consumer once, whichever view it attaches first; every view drains on
 * its own; the segment outlives its views (a free waits for them) and goes with the last one, telling
 * the consumers that mapped it. */
static void test_views_of_a_segment(void)
{
        Env *e = env_new(NULL);
        RegPeer *P = env_peer(e, 1000, 10, 1), *C = env_peer(e, 1001, 11, 1), *Q = env_peer(e, 2000, 20, 1);
        uint64_t v1, v2, v3, gens;
        Sent *s;
        int fd;

        /* The first view registers the segment with its fd; the second sends none. */
        v1 = publish_ok(e, P, (Pub){ .name = "w/a", .segment = 500, .size = 4096, .segment_size = 8192,
                                     .fd_mode = FD_FORCE });
        CHECK(v1 != 500);
        CHECK_EQ(state_of(e, 500), PROTO_STATE_IDLE);
        CHECK_EQ(gauges(e).buffers, 2);
        CHECK_EQ(gauges(e).fds, 1);
        v2 = publish_ok(e, P, (Pub){ .name = "w/b", .segment = 500, .offset = 4096, .size = 4096 });
        CHECK_EQ(gauges(e).fds, 1);
        /* An fd sent again for a registered segment is closed: the memory travels once. */
        gens = publish_ok(e, P, (Pub){ .name = "w/c", .segment = 500, .offset = 100, .size = 10, .segment_size = 8192,
                                       .fd_mode = FD_FORCE });
        CHECK_EQ(gauges(e).fds, 1);
        free_buf(e, P, gens, false);
        /* What a view cannot be. */
        env_check_status(publish(e, P, (Pub){ .name = "w/x", .segment = 600 }), PROTO_STATUS_NOT_FOUND);
        env_check_status(publish(e, P, (Pub){ .name = "w/x", .segment = 500, .offset = 4097, .size = 4096 }),
                         PROTO_STATUS_INVALID);
        env_check_status(publish(e, P, (Pub){ .name = "w/x", .segment = v1 }), PROTO_STATUS_INVALID);
        env_check_status(publish(e, Q, (Pub){ .name = "q/x", .segment = 500 }), PROTO_STATUS_NOT_OWNER);
        v3 = publish_ok(e, P, (Pub){ .name = "w/a", .segment = 500 }); /* replaces v1 */
        CHECK_EQ(state_of(e, v1), PROTO_STATE_IDLE);
        env_check_status(publish(e, P, (Pub){ .name = "w/a", .buffer = v1 }), PROTO_STATUS_OK); /* and back */
        CHECK_EQ(state_of(e, v3), PROTO_STATE_IDLE);
        free_buf(e, P, v3, false);

        /* A consumer maps the segment once: the first view brings its fd, the second is cached. */
        s = attach_ok(e, C, "w/a");
        CHECK_EQ(s->m.buffer, v1);
        CHECK_EQ(s->m.segment, 500);
        CHECK_EQ(s->m.segment_size, 8192);
        CHECK_EQ(s->m.offset, 0);
        CHECK_EQ(s->m.size, 4096);
        CHECK(!s->m.cached && s->fd >= 0);
        fd = s->fd;
        s = attach_ok(e, C, "w/b");
        CHECK_EQ(s->m.buffer, v2);
        CHECK_EQ(s->m.offset, 4096);
        CHECK(s->m.cached && s->fd == -1);
        CHECK_EQ(refs_of(e, v1), 1);
        CHECK_EQ(refs_of(e, v2), 1);
        CHECK_EQ(refs_of(e, 500), 0);

        /* Each view drains on its own. */
        retire(e, P, v1, false);
        CHECK_EQ(env_count_events(e, P, PROTO_EV_DRAINED), 0);
        s = release(e, C, v1);
        env_check_status(s, PROTO_STATUS_OK);
        CHECK_EQ(env_count_events(e, P, PROTO_EV_DRAINED), 1);
        CHECK_EQ(env_event(e, P, PROTO_EV_DRAINED)->m.buffer, v1);
        CHECK_EQ(state_of(e, v2), PROTO_STATE_LIVE);

        /* Freeing the segment waits for its views; meanwhile it takes no new ones. */
        env_check_status(free_buf(e, P, 500, false), PROTO_STATUS_OK);
        CHECK(registry_buffer_by_id(e->r, 500));
        env_check_status(publish(e, P, (Pub){ .name = "w/y", .segment = 500 }), PROTO_STATUS_STATE);
        free_buf(e, P, v1, false);
        CHECK(registry_buffer_by_id(e->r, 500));
        s = attach_ok(e, C, "w/b"); /* still attachable, still cached */
        CHECK(s->m.cached);
        release(e, C, v2);
        free_buf(e, P, v2, false); /* held: forgotten once drained, and the segment with it */
        CHECK(registry_buffer_by_id(e->r, v2));
        s = release(e, C, v2);
        env_check_status(s, PROTO_STATUS_OK);
        CHECK(registry_buffer_by_id(e->r, v2) == NULL);
        CHECK(registry_buffer_by_id(e->r, 500) == NULL);
        CHECK_EQ(env_count_events(e, C, PROTO_EV_FREED), 1);
        CHECK_EQ(env_event(e, C, PROTO_EV_FREED)->m.buffer, 500);
        CHECK_EQ(gauges(e).fds, 0);
        CHECK_EQ(gauges(e).buffers, 0);
        (void)fd;
        env_free(e);
}

/* A producer's death and its views: not broker-held, holders hear every view revoked under its own
 * name and the segment freed; broker-held, views and segment stay for them (attachable, cached) and the
 * segment goes with the last view. */
static void test_views_producer_death(void)
{
        Env *e = env_new(NULL);
        RegPeer *P = env_peer(e, 1000, 10, 1), *C = env_peer(e, 1001, 11, 1), *U;
        uint64_t v1, v2, h1, h2;
        Sent *ev;

        v1 = publish_ok(e, P, (Pub){ .name = "d/a", .segment = 700, .segment_size = 8192, .fd_mode = FD_FORCE });
        v2 = publish_ok(e, P, (Pub){ .name = "d/b", .segment = 700, .offset = 4096 });
        attach_ok(e, C, "d/a");
        attach_ok(e, C, "d/b");
        env_remove(e, P);
        CHECK_EQ(env_count_events(e, C, PROTO_EV_REVOKED), 2);
        ev = env_event(e, C, PROTO_EV_REVOKED);
        CHECK(ev->m.buffer == v1 || ev->m.buffer == v2);
        CHECK_EQ(env_count_events(e, C, PROTO_EV_FREED), 1);
        CHECK_EQ(env_event(e, C, PROTO_EV_FREED)->m.buffer, 700);
        CHECK_EQ(gauges(e).buffers, 0);
        CHECK_EQ(gauges(e).fds, 0);
        CHECK_EQ(gauges(e).refs, 0);

        P = env_peer(e, 1000, 12, 1);
        h1 = publish_ok(e, P, (Pub){ .name = "h/a", .segment = 800, .segment_size = 8192, .fd_mode = FD_FORCE,
                                     .held = true });
        publish_ok(e, P, (Pub){ .name = "h/b", .segment = 800, .offset = 4096 });
        attach_ok(e, C, "h/a");
        env_remove(e, P);
        CHECK_EQ(env_count_to(e, C), 0);
        CHECK_EQ(gauges(e).buffers, 3);
        CHECK_EQ(gauges(e).orphaned, 3);
        CHECK(attach_ok(e, C, "h/b")->m.cached);
        /* The producer's uid retires the views; the last drain takes the segment along. */
        U = env_peer(e, 1000, 13, 1);
        retire(e, U, h1, false);
        release(e, C, h1);
        CHECK(registry_buffer_by_id(e->r, 800));
        env_check_status(free_buf(e, U, h1, false), PROTO_STATUS_NOT_FOUND); /* an orphan goes once drained */
        h2 = attach_ok(e, C, "h/b")->m.buffer;
        release(e, C, h2);
        retire(e, U, h2, false);
        CHECK(registry_buffer_by_id(e->r, 800));
        release(e, C, h2);
        CHECK(registry_buffer_by_id(e->r, h2) == NULL);
        CHECK(registry_buffer_by_id(e->r, 800) == NULL);
        CHECK_EQ(env_count_events(e, C, PROTO_EV_FREED), 1);
        CHECK_EQ(gauges(e).buffers, 0);
        CHECK_EQ(gauges(e).fds, 0);
        env_free(e);
}

static void test_fd_accounting(void)
{
        unsigned before = env_count_open_fds();
        Env *e = env_new(NULL);
        RegPeer *P = env_peer(e, 1000, 10, 1), *P2 = env_peer(e, 1000, 11, 1), *C = env_peer(e, 1001, 12, 1);
        uint64_t a, b, c, d;

        a = publish_ok(e, P, (Pub){ .name = "fd/a" });
        b = publish_ok(e, P, (Pub){ .name = "fd/b", .held = true });
        c = publish_ok(e, P, (Pub){ .name = "fd/c", .kind = PROTO_KIND_CUDA_VMM, .device = "GPU-0" });
        d = publish_ok(e, P2, (Pub){ .name = "fd/d", .held = true });
        CHECK_EQ(env_count_open_fds(), before + 4);
        /* Refused publishes close their fd at once. */
        env_check_status(publish(e, P2, (Pub){ .name = "fd/a" }), PROTO_STATUS_NAME_TAKEN);
        env_check_status(publish(e, P, (Pub){ .name = "fd/a2", .buffer = a, .fd_mode = FD_FORCE }), PROTO_STATUS_STATE);
        CHECK_EQ(env_count_open_fds(), before + 4);
        /* A consumer holds some. */
        attach_ok(e, C, "fd/a");
        attach_ok(e, C, "fd/b");
        /* Freed while referenced: closed after the drain. */
        free_buf(e, P, a, false);
        CHECK_EQ(env_count_open_fds(), before + 4);
        release(e, C, a);
        CHECK_EQ(env_count_open_fds(), before + 3);
        /* Revoked with the producer: closed then; broker-held ones stay. */
        env_remove(e, P);
        CHECK(registry_buffer_by_id(e->r, c) == NULL);
        CHECK_EQ(env_count_open_fds(), before + 2);
        CHECK(registry_buffer_by_id(e->r, b) && registry_buffer_by_id(e->r, d));
        /* The rest, orphaned or not, goes with the registry. */
        env_free(e);
        CHECK_EQ(env_count_open_fds(), before);
}

/* A registry freed with everything in flight: peers, waits, groups, subscriptions, orphans. */
static void test_free_everything(void)
{
        Env *e = env_new(NULL);
        RegPeer *P = env_peer(e, 1000, 10, 1), *C = env_peer(e, 1001, 11, 1), *D = env_peer(e, 1002, 12, 1);

        publish_ok(e, P, (Pub){ .name = "e/1", .held = true });
        publish_ok(e, P, (Pub){ .name = "e/2" });
        publish_ok(e, D, (Pub){ .name = "e/3", .held = true });
        attach_ok(e, C, "e/1");
        attach_ok(e, C, "e/2");
        attach_name(e, C, "e/later", 1000);
        join(e, C, "grp", 3, 1000);
        join(e, D, "grp", 3, 1000);
        subscribe(e, C, "e/");
        env_remove(e, D); /* leaves an orphan */
        env_free(e);
}

/* Enough buffers, holds and names to grow every table several times. */
static void test_many(void)
{
        enum { N = 300 };
        static const char *const gpu[] = { "GPU-0" };
        Env *e = env_new(NULL);
        RegPeer *P = env_peer(e, 1000, 10, 1), *C[4];
        uint64_t ids[N];

        for (unsigned k = 0; k < 4; k++) {
                C[k] = env_peer(e, 2000 + k, 20 + k, 1);
                env_hello(e, C[k], 1, "c", 1, gpu);
        }
        for (unsigned i = 0; i < N; i++) {
                char name[32];
                snprintf(name, sizeof(name), "many/%u", i);
                ids[i] = publish_ok(e, P, (Pub){ .name = name, .kind = i % 2 ? PROTO_KIND_CUDA_LEGACY : 0,
                                                 .device = "GPU-0" });
                /* A consumer waits for the next name, which the next round publishes. */
                snprintf(name, sizeof(name), "many/%u", i + 1);
                attach_name(e, C[i % 4], name, 100000);
        }
        CHECK_EQ(gauges(e).waits, 1);
        for (unsigned i = 0; i < N; i++)
                for (unsigned k = 0; k < 4; k++)
                        if (i % 2 == 0)
                                env_check_status(env_reply(e, C[k], attach_id(e, C[k], ids[i])), PROTO_STATUS_OK);
        CHECK_EQ(gauges(e).refs, 4 * (N / 2) + (N - 1));
        for (unsigned i = 0; i < N; i += 3)
                free_buf(e, P, ids[i], false);
        env_remove(e, C[1]);
        env_remove(e, P);
        CHECK_EQ(gauges(e).buffers, 0);
        env_free(e);
}

/* The memory budget: what peers make the registry keep (connections, subscriptions, waits, buffers,
 * references) is charged to their uid, refused with quota past the uid's share, naming the budget,
 * while another uid keeps its own share, and all of it is given back when they go. */
static void test_memory_budget(void)
{
        Env *e = calloc(1, sizeof(*e));
        RegPeer *p, *q, *c;
        unsigned subs = 0;
        Budget b;
        Sent *s;

        CHECK(e);
        budget_init(&b, 64 * 1024, 32 * 1024); /* 16 KiB to hold for a uid, 32 KiB for all */
        env_init_cfg(e, (RegConfig){ .limits = LIMITS_DEFAULT, .id_seed = 1, .budget = &b, .peer_extra = 1024 });
        p = env_peer(e, 1000, 1, 0);
        CHECK(budget_uid_used(&b, 1000, BUDGET_HELD) >= 1024);
        for (;;) {
                s = subscribe(e, p, "x/");
                if (s->m.status != PROTO_STATUS_OK)
                        break;
                subs++;
        }
        env_check_status(s, PROTO_STATUS_QUOTA);
        CHECK(!env_why(s, REG_E_MEMORY_BUDGET)->memory_budget.whole_pool);
        CHECK_EQ(s->why->memory_budget.uid, 1000);
        CHECK(subs > 4 && subs < 64);
        /* A wait and a second connection of the same uid do not fit either; another uid's do. */
        env_check_status(env_reply(e, p, attach_name(e, p, "x/later", 10000)), PROTO_STATUS_QUOTA);
        CHECK_EQ(registry_peer_add(e->r, &(PeerCreds){ .uid = 1000 }, 0, NULL, &c, NULL), REG_E_MEMORY_BUDGET);
        q = env_peer(e, 2000, 2, 0);
        env_check_status(subscribe(e, q, "x/"), PROTO_STATUS_OK);
        publish_ok(e, q, (Pub){ .name = "x/a" });
        c = env_peer(e, 3000, 3, 0);
        attach_ok(e, c, "x/a");
        CHECK(budget_uid_used(&b, 3000, BUDGET_HELD) >= 64);
        /* Everything goes back: the subscriptions, the buffer, the reference, the connections. */
        env_remove(e, p);
        CHECK_EQ(budget_uid_used(&b, 1000, BUDGET_HELD), 0);
        env_remove(e, c);
        env_remove(e, q);
        CHECK_EQ(b.used[BUDGET_HELD], 0);
        CHECK_EQ(b.uids.count, 0);
        CHECK_EQ(b.mismatched, 0);
        env_fini(e);
        free(e);
        budget_deinit(&b);
}

int main(int argc, char **argv)
{
        TEST_RUN(argc, argv, test_publish_attach_release_retire);
        TEST_RUN(argc, argv, test_retire_while_held);
        TEST_RUN(argc, argv, test_attach_waits_for_publish);
        TEST_RUN(argc, argv, test_attach_timeout);
        TEST_RUN(argc, argv, test_retire_after);
        TEST_RUN(argc, argv, test_name_taken);
        TEST_RUN(argc, argv, test_same_producer_replaces);
        TEST_RUN(argc, argv, test_republish_idle);
        TEST_RUN(argc, argv, test_fd_cached_and_unmap);
        TEST_RUN(argc, argv, test_legacy_handle);
        TEST_RUN(argc, argv, test_consumer_death);
        TEST_RUN(argc, argv, test_producer_death_revokes);
        TEST_RUN(argc, argv, test_held_memory_quota);
        TEST_RUN(argc, argv, test_producer_death_broker_held);
        TEST_RUN(argc, argv, test_restored_retired_waits_for_grace);
        TEST_RUN(argc, argv, test_claims_wait_for_their_producer);
        TEST_RUN(argc, argv, test_claims_revoked_at_grace_end);
        TEST_RUN(argc, argv, test_reclaim_only_the_same_publication);
        TEST_RUN(argc, argv, test_reclaim_results);
        TEST_RUN(argc, argv, test_ids_keys_and_adoption);
        TEST_RUN(argc, argv, test_restored_name_taken_registers_retired);
        TEST_RUN(argc, argv, test_broker_held_orphan_by_uid_free);
        TEST_RUN(argc, argv, test_orphan_takeover);
        TEST_RUN(argc, argv, test_cancel_waits);
        TEST_RUN(argc, argv, test_remove_in_one_batch);
        TEST_RUN(argc, argv, test_outbox);
        TEST_RUN(argc, argv, test_free_live);
        TEST_RUN(argc, argv, test_quotas);
        TEST_RUN(argc, argv, test_subscriptions);
        TEST_RUN(argc, argv, test_groups);
        TEST_RUN(argc, argv, test_legacy_same_pid);
        TEST_RUN(argc, argv, test_legacy_same_pid_declared);
        TEST_RUN(argc, argv, test_pidns_declared_in_listings);
        TEST_RUN(argc, argv, test_device_diagnosis);
        TEST_RUN(argc, argv, test_hello);
        TEST_RUN(argc, argv, test_views);
        TEST_RUN(argc, argv, test_bytes_shared_and_held);
        TEST_RUN(argc, argv, test_views_of_a_segment);
        TEST_RUN(argc, argv, test_views_producer_death);
        TEST_RUN(argc, argv, test_fd_accounting);
        TEST_RUN(argc, argv, test_free_everything);
        TEST_RUN(argc, argv, test_many);
        TEST_RUN(argc, argv, test_memory_budget);
        return TEST_END();
}
