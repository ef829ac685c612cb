/* What a reclaim may take (docs/protocol.md 6.15): references the claimant provably held, or what an
 * attach would have granted. A peer that never attached a buffer gets no more by reclaiming it than by
 * attaching it: the buffer must be live, and each reference counts toward retire_after; a retired
 * buffer gives references only back to a uid whose connection held them when the broker ended it.
 * And pending claims, which nobody can vouch for until their producer comes back, are bounded per
 * uid and for all peers together (quota), whatever the number of connections. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "macro.h"

/* A long grace, so that claims stay pending for the whole case. */
static const char *const grace_flags[] = { "--restart-grace-ms", "600000", NULL };

typedef struct Raw {
        int sock;
        HFrame *f;
        uint64_t next_id;
} Raw;

static unsigned raw_call(Raw *w, ProtoMsg *req)
{
        proto_set_id(req, ++w->next_id);
        return h_raw_call(w->sock, req, -1, w->f);
}

static Raw raw_open(const HBroker *b)
{
        Raw w = { .sock = h_raw_connect(b), .f = h_frame_new() };

        h_raw_hello(w.sock);
        return w;
}

static void raw_close(Raw *w)
{
        close(w->sock);
        h_frame_free(w->f);
}

/* Reclaims refs references on (buffer, generation), a memfd buffer of this uid named name: the status. */
static unsigned raw_reclaim(Raw *w, uint64_t buffer, uint64_t generation, uint32_t refs, const char *name)
{
        ProtoMsg req;

        proto_request_init(&req, PROTO_OP_RECLAIM);
        proto_set_buffer(&req, buffer);
        proto_set_generation(&req, generation);
        proto_set_refs(&req, refs);
        proto_set_uid(&req, getuid());
        proto_set_name(&req, proto_str(name));
        proto_set_kind(&req, PROTO_KIND_MEMFD);
        return raw_call(w, &req);
}

/* Whether the last reply's message contains needle. */
static bool said(const Raw *w, const char *needle)
{
        return memmem(w->f->msg.message.ptr, w->f->msg.message.len, needle, strlen(needle)) != NULL;
}

static unsigned raw_release(Raw *w, uint64_t buffer)
{
        ProtoMsg req;

        proto_request_init(&req, PROTO_OP_RELEASE);
        proto_set_buffer(&req, buffer);
        return raw_call(w, &req);
}

static unsigned raw_attach(Raw *w, const char *name)
{
        ProtoMsg req;

        proto_request_init(&req, PROTO_OP_ATTACH);
        proto_set_name(&req, proto_str(name));
        return raw_call(w, &req);
}

/* Waits until the broker's view of the buffer says refs references (a connection's end is
 * processed asynchronously). */
static void await_refs(gpuipc_t *obs, uint64_t id, uint64_t refs)
{
        uint64_t dl = monotonic_ms() + H_SOON_MS;
        HStat st;

        for (;;) {
                CHECK_OK(obs, h_stat_id(obs, id, &st));
                if (st.refs == refs)
                        return;
                CHECKF(monotonic_ms() < dl, "buffer %llu has %llu references, not %llu", (unsigned long long)id,
                       (unsigned long long)st.refs, (unsigned long long)refs);
                h_sleep_ms(10);
        }
}

/* ---- item 3: a reclaim gives no more than the claimant held ---- */

/* The case: retire_after=1, a peer that never attached reclaims 5 references. An attach
 * would have given it one and retired the buffer; so does the reclaim, and no more. */
static void test_unheld_live_buffer_is_an_attach(void)
{
        gpuipc_publish_options_t po = { .struct_size = sizeof(po), .retire_after = 1 };
        gpuipc_buffer_t *buf;
        gpuipc_t *prod, *cons;
        HCase k;
        HStat st;
        Raw w;

        h_case_begin(&k, NULL);
        prod = h_connect(k.broker, "producer");
        cons = h_connect(k.broker, "consumer");
        buf = h_publish(prod, "reclaim/once", 4096, 7, &po);
        CHECK_OK(k.obs, h_stat(k.obs, "reclaim/once", &st));
        w = raw_open(k.broker);

        CHECK_EQ(raw_reclaim(&w, st.buffer, st.generation, 5, "reclaim/once"), PROTO_STATUS_REVOKED);
        CHECKF(said(&w, "retires after"), "the refusal names retire_after: %.*s", (int)w.f->msg.message.len,
               w.f->msg.message.ptr);
        CHECK_OK(k.obs, h_stat(k.obs, "reclaim/once", &st));
        CHECK_EQ(st.refs, 0);
        CHECK_EQ(st.state, PROTO_STATE_LIVE);

        /* One reference is what one attach gives: granted, and it uses retire_after up. */
        CHECK_EQ(raw_reclaim(&w, st.buffer, st.generation, 1, "reclaim/once"), PROTO_STATUS_OK);
        CHECK_EQ(h_stat(k.obs, "reclaim/once", &st), GPUIPC_E_NOT_FOUND);
        CHECK_OK(k.obs, h_stat_id(k.obs, gpuipc_buffer_id(buf), &st));
        CHECK_EQ(st.state, PROTO_STATE_RETIRED);
        CHECK_EQ(st.refs, 1);
        CHECK_EQ(raw_release(&w, st.buffer), PROTO_STATUS_OK);
        raw_close(&w);
        CHECK_OK(prod, gpuipc_buffer_free(prod, buf));
        gpuipc_close(cons);
        gpuipc_close(prod);
        h_case_end(&k);
}

/* A retired buffer: an attach would give nothing, and this uid held nothing on it. */
static void test_unheld_retired_buffer_is_refused(void)
{
        gpuipc_buffer_t *buf, *held;
        gpuipc_t *prod, *cons;
        gpuipc_event_t ev;
        HCase k;
        HStat st;
        Raw w;

        h_case_begin(&k, NULL);
        prod = h_connect(k.broker, "producer");
        cons = h_connect(k.broker, "consumer");
        buf = h_publish(prod, "reclaim/retired", 4096, 8, NULL);
        held = h_attach_verify(cons, "reclaim/retired", 0, 8);
        CHECK_OK(prod, gpuipc_retire(prod, buf));
        CHECK_OK(k.obs, h_stat_id(k.obs, gpuipc_buffer_id(buf), &st));
        CHECK_EQ(st.state, PROTO_STATE_RETIRED);
        w = raw_open(k.broker);

        CHECK_EQ(raw_reclaim(&w, st.buffer, st.generation, 1, "reclaim/retired"), PROTO_STATUS_REVOKED);
        CHECK_OK(k.obs, h_stat_id(k.obs, st.buffer, &st));
        CHECK_EQ(st.refs, 1);
        raw_close(&w);
        /* The one real holder lets go: it drains, nobody else keeps it. */
        CHECK_OK(cons, gpuipc_release(cons, held));
        CHECK_OK(prod, h_next_event_of(prod, GPUIPC_EVENT_DRAINED, H_SOON_MS, &ev));
        CHECK_OK(prod, gpuipc_buffer_free(prod, buf));
        gpuipc_close(cons);
        gpuipc_close(prod);
        h_case_end(&k);
}

/* A consumer whose connection the broker ended comes back on a new one: the broker vouches for the
 * references it held (even on a retired buffer, and beyond retire_after), and for no more. */
static void test_dropped_holder_gets_its_references_back(void)
{
        gpuipc_publish_options_t po = { .struct_size = sizeof(po), .retire_after = 2 };
        gpuipc_buffer_t *buf, *other;
        gpuipc_t *prod, *cons;
        gpuipc_event_t ev;
        HCase k;
        HStat st;
        Raw w;

        h_case_begin(&k, NULL);
        prod = h_connect(k.broker, "producer");
        cons = h_connect(k.broker, "consumer");
        buf = h_publish(prod, "reclaim/dropped", 4096, 9, &po);
        CHECK_OK(k.obs, h_stat(k.obs, "reclaim/dropped", &st));
        w = raw_open(k.broker);
        CHECK_EQ(raw_attach(&w, "reclaim/dropped"), PROTO_STATUS_OK);
        other = h_attach_verify(cons, "reclaim/dropped", 0, 9); /* the second attach retires it */
        raw_close(&w);
        await_refs(k.obs, st.buffer, 1);

        w = raw_open(k.broker);
        CHECK_EQ(raw_reclaim(&w, st.buffer, st.generation, 1, "reclaim/dropped"), PROTO_STATUS_OK);
        CHECK_EQ(raw_reclaim(&w, st.buffer, st.generation, 1, "reclaim/dropped"), PROTO_STATUS_REVOKED);
        CHECK_OK(k.obs, h_stat_id(k.obs, st.buffer, &st));
        CHECK_EQ(st.refs, 2);
        CHECK_EQ(st.state, PROTO_STATE_RETIRED);
        CHECK_EQ(raw_release(&w, st.buffer), PROTO_STATUS_OK);
        CHECK_OK(cons, gpuipc_release(cons, other));
        CHECK_OK(prod, h_next_event_of(prod, GPUIPC_EVENT_DRAINED, H_SOON_MS, &ev));
        raw_close(&w);
        CHECK_OK(prod, gpuipc_buffer_free(prod, buf));
        gpuipc_close(cons);
        gpuipc_close(prod);
        h_case_end(&k);
}

/* ---- item 4: pending claims are bounded per uid and in all ---- */

/* Waits until the broker keeps n pending claims (a connection's end is processed asynchronously). */
static void await_claims(gpuipc_t *obs, uint64_t n)
{
        uint64_t dl = monotonic_ms() + H_SOON_MS;

        while (h_stats(obs, "claims_pending") != n) {
                CHECKF(monotonic_ms() < dl, "the broker keeps %llu pending claims, not %llu",
                       (unsigned long long)h_stats(obs, "claims_pending"), (unsigned long long)n);
                h_sleep_ms(10);
        }
}

/* Makes n pending claims (ids from first on) on w, each of one reference, expecting status. */
static void claim_n(Raw *w, uint64_t first, unsigned n, unsigned status)
{
        for (unsigned i = 0; i < n; i++) {
                unsigned st = raw_reclaim(w, first + i, 1, 1, "reclaim/pending");

                CHECKF(st == status, "claim %u of %u: %s, not %s (%.*s)", i + 1, n, proto_status_name(st),
                       proto_status_name(status), (int)w->f->msg.message.len, w->f->msg.message.ptr);
                if (status == PROTO_STATUS_OK)
                        CHECK(w->f->msg.pending);
        }
}

/* With the default limits, more connections of one uid do not make more room: the uid's peers keep
 * at most 65536 pending claims (each connection alone could keep as many). */
static void test_claims_per_uid_default(void)
{
        HCase k;
        Raw a, b;

        h_case_begin(&k, grace_flags);
        a = raw_open(k.broker);
        b = raw_open(k.broker);
        claim_n(&a, 1u << 20, 65536, PROTO_STATUS_OK);
        claim_n(&b, 1u << 21, 1, PROTO_STATUS_QUOTA);
        CHECK(said(&b, "pending claims"));
        CHECK_EQ(h_stats(k.obs, "claims_pending"), 65536);
        /* Room comes back as claims go: a release drops one, a connection's end all of its own. */
        CHECK_EQ(raw_release(&a, 1u << 20), PROTO_STATUS_OK);
        claim_n(&b, 1u << 21, 1, PROTO_STATUS_OK);
        claim_n(&b, (1u << 21) + 1, 1, PROTO_STATUS_QUOTA);
        raw_close(&a);
        await_claims(k.obs, 1);
        claim_n(&b, (1u << 21) + 2, 4, PROTO_STATUS_OK);
        raw_close(&b);
        h_case_end(&k);
}

/* The flags: a smaller per-uid bound, and a global one below it. */
static void test_claims_bounded_by_flags(void)
{
        static const char *const per_uid[] = { "--restart-grace-ms", "600000", "--max-claims-per-uid", "8", NULL };
        static const char *const global[] = { "--restart-grace-ms", "600000", "--max-claims", "5",
                                              "--max-claims-per-uid", "100", NULL };
        HCase k;
        Raw a, b;

        h_case_begin(&k, per_uid);
        a = raw_open(k.broker);
        b = raw_open(k.broker);
        claim_n(&a, 100, 5, PROTO_STATUS_OK);
        claim_n(&b, 200, 3, PROTO_STATUS_OK);
        claim_n(&b, 300, 1, PROTO_STATUS_QUOTA);
        raw_close(&a);
        raw_close(&b);
        h_case_end(&k);

        h_case_begin(&k, global);
        a = raw_open(k.broker);
        b = raw_open(k.broker);
        claim_n(&a, 100, 3, PROTO_STATUS_OK);
        claim_n(&b, 200, 2, PROTO_STATUS_OK);
        claim_n(&b, 300, 1, PROTO_STATUS_QUOTA);
        CHECK(said(&b, "all peers"));
        raw_close(&a);
        raw_close(&b);
        h_case_end(&k);
}

int main(int argc, char **argv)
{
        static const HTest tests[] = {
                H_TEST(test_unheld_live_buffer_is_an_attach),
                H_TEST(test_unheld_retired_buffer_is_refused),
                H_TEST(test_dropped_holder_gets_its_references_back),
                H_TEST(test_claims_per_uid_default),
                H_TEST(test_claims_bounded_by_flags),
        };

        return h_main(argc, argv, tests, sizeof(tests) / sizeof(tests[0]));
}
