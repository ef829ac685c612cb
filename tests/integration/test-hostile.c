/* Hostile and broken peers on raw sockets: malformed, oversized and truncated frames, fd count
 * mismatches, random bytes, zero-length records, wrong magic and version, requests before hello,
 * fds riding on requests that take none, and publish with the wrong kind of fd. Each gets an error
 * reply (status protocol, then a closed connection, for framing violations), every fd sent along
 * is closed, the broker's fd count returns to its baseline, and the bystander keeps working. */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <inttypes.h>
#include <libgen.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"
#include "seals.h"

/* ---- helpers ---- */

/* A pipe whose write end travels to the broker: once every copy of it is closed (ours right after
 * sending), the read end reports HUP, which is how we see the broker closed the fd it received. */
typedef struct Probe {
        int rd, wr;
} Probe;

static Probe probe_new(void)
{
        int p[2];

        CHECK(pipe2(p, O_CLOEXEC) == 0);
        return (Probe){ p[0], p[1] };
}

/* Call after sending: drops our copy of the write end and waits for the broker to drop its own. */
static void probe_expect_closed(Probe *p, const char *what)
{
        if (p->wr >= 0)
                close(p->wr);
        p->wr = -1;
        WAIT_UNTIL(h_pipe_writer_gone(p->rd), H_SOON_MS);
        (void)what;
        close(p->rd);
        p->rd = -1;
}

/* A memfd of size bytes with the given seals. */
static int memfd_sealed(size_t size, int seals)
{
        int fd = memfd_create("hostile", MFD_CLOEXEC | MFD_ALLOW_SEALING);

        CHECK(fd >= 0);
        CHECK(ftruncate(fd, (off_t)size) == 0);
        if (seals)
                CHECK(fcntl(fd, F_ADD_SEALS, seals) == 0);
        return fd;
}

static void frame_header(uint8_t *out, uint32_t body_len, uint8_t n_fds)
{
        proto_header_write(out, body_len, n_fds);
}

/* The bytes of a well-formed ping frame (id 1), to be corrupted by the caller. */
static size_t ping_frame(uint8_t *out, size_t cap)
{
        ProtoMsg m = { .op = PROTO_OP_PING, .id = 1, .has = PROTO_BIT(PF_OP) | PROTO_BIT(PF_ID) };
        ProtoBuf b = { 0 };
        size_t len;

        CHECK_EQ(proto_frame_encode(&b, &m, 0), 0);
        CHECK(b.len <= cap);
        memcpy(out, b.data, b.len);
        len = b.len;
        proto_buf_free(&b);
        return len;
}

/* Requires a connection-level protocol error reply (reply 0, status protocol, a message) and then
 * the connection closed. Returns false when the connection was closed without any reply. */
static bool expect_protocol_error_then_eof(int sock, bool reply_required, const char *what)
{
        HFrame *f = h_frame_new();
        bool replied = false;
        int r = h_raw_recv(sock, H_SOON_MS, f);

        CHECKF(r >= 0, "%s: neither a reply nor a closed connection within %d ms", what, H_SOON_MS);
        if (r > 0) {
                CHECKF(f->msg.type == PROTO_REPLY, "%s: the broker sent a frame that is not a reply", what);
                CHECKF(f->msg.status == PROTO_STATUS_PROTOCOL, "%s: status %s, expected protocol", what,
                       proto_status_name((unsigned)f->msg.status));
                CHECK_EQ(f->msg.reply, 0);
                CHECKF(proto_str_eq(f->msg.error, "protocol"), "%s: error field '%.*s'", what,
                       (int)f->msg.error.len, f->msg.error.ptr);
                CHECKF(f->msg.message.len > 0, "%s: the protocol error has no message", what);
                h_log("%s -> protocol error: %.*s", what, (int)f->msg.message.len, f->msg.message.ptr);
                replied = true;
        }
        CHECKF(!reply_required || replied, "%s: the connection was closed without an error reply", what);
        CHECKF(h_raw_wait_eof(sock, H_SOON_MS), "%s: the broker kept the connection open after a violation",
               what);
        h_frame_free(f);
        return replied;
}

/* Sends one record (with fds) on a fresh connection and requires the violation to be answered
 * and the connection closed; every fd sent is closed by the broker. */
static void expect_violation(HCase *k, const char *what, const void *buf, size_t len, int n_probes,
                             bool reply_required)
{
        uint64_t before = h_stats(k->obs, "protocol_errors_total");
        Probe probes[16];
        int fds[16], sock = h_raw_connect(k->broker), r;

        CHECK(n_probes <= 16);
        for (int i = 0; i < n_probes; i++) {
                probes[i] = probe_new();
                fds[i] = probes[i].wr;
        }
        r = h_raw_send(sock, buf, len, fds, (size_t)n_probes);
        CHECKF(r == 0, "%s: send: %s", what, strerror(-r));
        for (int i = 0; i < n_probes; i++)
                probe_expect_closed(&probes[i], what);
        if (expect_protocol_error_then_eof(sock, reply_required, what))
                CHECK_EQ(h_stats(k->obs, "protocol_errors_total"), before + 1);
        close(sock);
        h_bystander_check(k);
}

/* A raw connection that said hello. */
static int raw_peer(HCase *k)
{
        int sock = h_raw_connect(k->broker);

        h_raw_hello(sock);
        return sock;
}

/* The connection still answers a ping (after a request error that must not close it). */
static void expect_alive(int sock)
{
        ProtoMsg ping = { .op = PROTO_OP_PING, .has = PROTO_BIT(PF_OP) };
        HFrame *f = h_frame_new();

        CHECK_EQ(h_raw_call(sock, &ping, -1, f), PROTO_STATUS_OK);
        h_frame_free(f);
}

/* Sends req (with fd, or -1) and requires a reply with this status and a non-empty message. */
static void expect_status(int sock, ProtoMsg *req, int fd, unsigned status)
{
        HFrame *f = h_frame_new();
        unsigned got = h_raw_call(sock, req, fd, f);

        CHECKF(got == status, "%s answered %s (%.*s), expected %s", proto_op_name(req->op),
               proto_status_name(got), (int)f->msg.message.len, f->msg.message.ptr,
               proto_status_name(status));
        CHECKF(status == PROTO_STATUS_OK || f->msg.message.len > 0, "the %s error has no message",
               proto_status_name(status));
        if (status != PROTO_STATUS_OK)
                h_log("%s -> %s: %.*s", proto_op_name(req->op), proto_status_name(got),
                      (int)f->msg.message.len, f->msg.message.ptr);
        h_frame_free(f);
}

/* ---- framing violations ---- */

/* A body that is not one valid msgpack map is a framing violation that closes the connection, wherever the bad byte
 * sits. */
static void test_malformed_msgpack(void)
{
        static const uint8_t bodies[][8] = {
                { 0xc1 },                 /* a byte msgpack never uses */
                { 0x81, 0xa2, 'o', 'p' }, /* a map whose value is missing */
                { 0x92, 0x01, 0x02 },     /* an array, not a map */
                { 0x80, 0x00 },           /* an empty map and a trailing byte */
                { 0x83, 0xa2, 'o', 'p' }, /* three entries announced, one key present */
        };
        static const size_t lens[] = { 1, 4, 3, 2, 4 };
        static const uint8_t c1_value[] = { 0x81, 0xa2, 'o', 'p', 0xc1 }; /* a never-used byte as a value */
        uint8_t frame[64];
        HCase k;

        h_case_begin(&k, NULL);
        for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
                char what[64];

                frame_header(frame, (uint32_t)lens[i], 0);
                memcpy(frame + PROTO_HEADER_SIZE, bodies[i], lens[i]);
                snprintf(what, sizeof(what), "bad msgpack #%zu", i);
                expect_violation(&k, what, frame, PROTO_HEADER_SIZE + lens[i], 0, true);
        }
        /* 0xc1 is not msgpack at all, wherever it appears: a framing violation like the rest. */
        {
                int sock = h_raw_connect(k.broker);
                HFrame *f = h_frame_new();

                frame_header(frame, sizeof(c1_value), 0);
                memcpy(frame + PROTO_HEADER_SIZE, c1_value, sizeof(c1_value));
                CHECK_EQ(h_raw_send(sock, frame, PROTO_HEADER_SIZE + sizeof(c1_value), NULL, 0), 0);
                CHECK_EQ(h_raw_recv(sock, H_SOON_MS, f), 1);
                CHECK(f->msg.status == PROTO_STATUS_PROTOCOL);
                if (f->msg.status != PROTO_STATUS_PROTOCOL) {
                        /* What it does today: a field error, and the connection stays usable. */
                        CHECK_EQ(f->msg.status, PROTO_STATUS_BAD_REQUEST);
                        expect_alive(sock);
                } else {
                        CHECK(h_raw_wait_eof(sock, H_SOON_MS));
                }
                h_frame_free(f);
                close(sock);
                h_bystander_check(&k);
        }
        /* The msgpack-c trap: a map32 header announcing 4 billion entries, and one inside a field. */
        {
                static const uint8_t huge_map[] = { 0xdf, 0xff, 0xff, 0xff, 0xff };
                static const uint8_t huge_list[] = {
                        0x82, 0xa2, 'o', 'p', 0xa5, 'h',  'e',  'l',  'l',  'o',
                        0xa4, 'g',  'p', 'u', 's',  0xdd, 0xff, 0xff, 0xff, 0xff
                };
                frame_header(frame, sizeof(huge_map), 0);
                memcpy(frame + PROTO_HEADER_SIZE, huge_map, sizeof(huge_map));
                expect_violation(&k, "map32 announcing 2^32-1 entries", frame,
                                 PROTO_HEADER_SIZE + sizeof(huge_map), 0, true);
                /* Within a known field the count is over that field's limit: a bad request (the
                 * connection may stay), never an allocation of what the header announces. */
                {
                        int sock = h_raw_connect(k.broker);
                        HFrame *f = h_frame_new();

                        frame_header(frame, sizeof(huge_list), 0);
                        memcpy(frame + PROTO_HEADER_SIZE, huge_list, sizeof(huge_list));
                        CHECK_EQ(h_raw_send(sock, frame, PROTO_HEADER_SIZE + sizeof(huge_list), NULL, 0), 0);
                        CHECK_EQ(h_raw_recv(sock, H_SOON_MS, f), 1);
                        CHECKF(f->msg.status == PROTO_STATUS_BAD_REQUEST ||
                                       f->msg.status == PROTO_STATUS_PROTOCOL,
                               "a hello with 2^32-1 gpus: %s", proto_status_name((unsigned)f->msg.status));
                        h_frame_free(f);
                        close(sock);
                        h_bystander_check(&k);
                }
        }
        h_case_end(&k);
}

/* A frame over the size limit, or a header announcing one, closes the connection, and an fd riding along is closed
 * too. */
static void test_oversized_frame(void)
{
        size_t len = PROTO_MAX_FRAME + 1;
        uint8_t *big = calloc(1, len + 4096);
        HCase k;

        CHECK(big);
        h_case_begin(&k, NULL);
        /* A header that claims the maximum body, followed by one byte more than a frame may hold. */
        frame_header(big, PROTO_MAX_BODY, 0);
        memset(big + PROTO_HEADER_SIZE, 0xa1, len - PROTO_HEADER_SIZE);
        expect_violation(&k, "frame of 64 KiB + 13 bytes", big, len, 0, true);
        /* ... with an fd riding along: it must be closed as well. */
        expect_violation(&k, "oversized frame with an fd", big, len, 1, true);
        /* Far over the limit. */
        frame_header(big, PROTO_MAX_BODY, 0);
        expect_violation(&k, "frame of 68 KiB", big, len + 4000, 0, true);
        /* A header announcing more than the limit, on a small frame. */
        frame_header(big, PROTO_MAX_BODY + 1, 0);
        expect_violation(&k, "header announcing 64 KiB + 1", big, PROTO_HEADER_SIZE + 16, 0, true);
        free(big);
        h_case_end(&k);
}

/* Any disagreement between the fds a header announces and those that arrive is a violation: the connection is
 * closed and every fd that came is closed. */
static void test_fd_count_mismatch(void)
{
        uint8_t frame[256];
        size_t len;
        HCase k;

        h_case_begin(&k, NULL);
        len = ping_frame(frame, sizeof(frame));
        /* Announces one fd, carries none. */
        frame[5] = 1;
        expect_violation(&k, "header announces 1 fd, none sent", frame, len, 0, true);
        /* Carries an fd it does not announce. */
        frame[5] = 0;
        expect_violation(&k, "an fd the header does not announce", frame, len, 1, true);
        /* Announces two (over the limit of one) and carries two. */
        frame[5] = 2;
        expect_violation(&k, "two fds announced and sent", frame, len, 2, true);
        /* Announces one and carries three. */
        frame[5] = 1;
        expect_violation(&k, "one fd announced, three sent", frame, len, 3, true);
        /* More fds than the broker's control buffer holds (the kernel truncates and closes the rest). */
        expect_violation(&k, "sixteen fds", frame, len, 16, true);
        h_case_end(&k);
}

/* A wrong magic, version or reserved byte, or a length that disagrees with the record, closes the connection. */
static void test_wrong_magic_and_version(void)
{
        uint8_t frame[256], bad[256];
        size_t len;
        HCase k;

        h_case_begin(&k, NULL);
        len = ping_frame(frame, sizeof(frame));
        memcpy(bad, frame, len);
        memcpy(bad, "GIPX", 4);
        expect_violation(&k, "wrong magic", bad, len, 0, true);
        memcpy(bad, "HTTP", 4);
        expect_violation(&k, "wrong magic with an fd", bad, len, 1, true);
        memcpy(bad, frame, len);
        bad[4] = PROTO_VERSION + 1;
        expect_violation(&k, "wrong version", bad, len, 0, true);
        bad[4] = 0;
        expect_violation(&k, "version 0", bad, len, 0, true);
        memcpy(bad, frame, len);
        bad[6] = 1;
        expect_violation(&k, "reserved header byte set", bad, len, 0, true);
        /* Length field and record length disagree, both ways; a record shorter than a header. */
        memcpy(bad, frame, len);
        expect_violation(&k, "body shorter than announced", bad, len - 1, 0, true);
        memcpy(bad + len, "\x00", 1);
        expect_violation(&k, "body longer than announced", bad, len + 1, 0, true);
        expect_violation(&k, "5-byte record", bad, 5, 0, true);
        expect_violation(&k, "header without a body", bad, PROTO_HEADER_SIZE, 0, true);
        h_case_end(&k);
}

/* A peer sending a reply or an event instead of a request is a violation that closes the connection. */
static void test_not_a_request(void)
{
        ProtoMsg reply = { .reply = 7, .status = 0, .has = PROTO_BIT(PF_REPLY) | PROTO_BIT(PF_STATUS) };
        ProtoMsg event = { .event = PROTO_EV_DRAINED,
                           .buffer = 1,
                           .has = PROTO_BIT(PF_EVENT) | PROTO_BIT(PF_BUFFER) };
        ProtoBuf b = { 0 };
        HCase k;

        h_case_begin(&k, NULL);
        CHECK_EQ(proto_frame_encode(&b, &reply, 0), 0);
        expect_violation(&k, "a peer sending a reply", b.data, b.len, 0, true);
        proto_buf_free(&b);
        CHECK_EQ(proto_frame_encode(&b, &event, 0), 0);
        expect_violation(&k, "a peer sending an event", b.data, b.len, 0, true);
        proto_buf_free(&b);
        h_case_end(&k);
}

/* A zero-length record (which recvmsg cannot tell from EOF) only makes the broker hang up, and closes an fd sent
 * with it. */
static void test_zero_length_record(void)
{
        int sock;
        HCase k;

        h_case_begin(&k, NULL);
        /* Indistinguishable from EOF to recvmsg: the broker may only hang up, and must not crash. */
        expect_violation(&k, "zero-length record", "", 0, 0, false);
        /* With an fd it is no EOF: a record too short for a header, and the fd is closed. */
        expect_violation(&k, "zero-length record with an fd", "", 0, 1, false);
        /* The same after a hello, with buffers around. */
        sock = raw_peer(&k);
        CHECK_EQ(h_raw_send(sock, "", 0, NULL, 0), 0);
        CHECKF(h_raw_wait_eof(sock, H_SOON_MS), "a zero-length record left the connection open");
        close(sock);
        h_bystander_check(&k);
        h_case_end(&k);
}

/* splitmix64: reproducible garbage from GPUIPC_TEST_SEED. */
static uint64_t rnd(uint64_t *s)
{
        uint64_t x = (*s += 0x9e3779b97f4a7c15ULL);
        x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
        x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
        return x ^ (x >> 31);
}

/* 48 records of random bytes (half past the header check) never crash the broker: each is answered with an error or
 * closes its connection, and every fd sent is closed. */
static void test_random_bytes(void)
{
        const char *env = getenv("GPUIPC_TEST_SEED");
        uint64_t seed = env ? strtoull(env, NULL, 0) : 20261129, s = seed;
        uint8_t *buf = malloc(PROTO_MAX_FRAME);
        unsigned closed = 0, alive = 0;
        HCase k;

        CHECK(buf);
        h_log("seed %" PRIu64 " (GPUIPC_TEST_SEED)", seed);
        h_case_begin(&k, NULL);
        for (int i = 0; i < 48; i++) {
                size_t len = 1 + rnd(&s) % (i % 4 == 0 ? 65000 : 300);
                int n_probes = (int)(rnd(&s) % 3), fds[2], sock = h_raw_connect(k.broker);
                Probe probes[2];
                HFrame *f = h_frame_new();
                ProtoMsg ping = { .op = PROTO_OP_PING,
                                  .id = 99,
                                  .has = PROTO_BIT(PF_OP) | PROTO_BIT(PF_ID) };
                int r;

                for (size_t j = 0; j < len; j++)
                        buf[j] = (uint8_t)rnd(&s);
                /* Half of them get past the header check to the message decoder. */
                if (i % 2 && len > PROTO_HEADER_SIZE)
                        frame_header(buf, (uint32_t)(len - PROTO_HEADER_SIZE), (uint8_t)n_probes);
                for (int j = 0; j < n_probes; j++) {
                        probes[j] = probe_new();
                        fds[j] = probes[j].wr;
                }
                CHECK_EQ(h_raw_send(sock, buf, len, fds, (size_t)n_probes), 0);
                for (int j = 0; j < n_probes; j++)
                        probe_expect_closed(&probes[j], "random");
                /* Then a valid ping: its reply says the connection survived, EOF that it did not. */
                h_raw_send_msg(sock, &ping, 0, NULL, 0);
                for (;;) {
                        r = h_raw_recv(sock, H_SOON_MS, f);
                        CHECKF(r >= 0, "random record #%d (%zu bytes): no answer", i, len);
                        if (r == 0 || (f->msg.type == PROTO_REPLY && f->msg.reply == 99))
                                break;
                        CHECKF(f->msg.type == PROTO_REPLY && f->msg.status != PROTO_STATUS_OK,
                               "random record #%d got an unexpected frame", i);
                }
                if (r == 0)
                        closed++;
                else
                        alive++;
                h_frame_free(f);
                close(sock);
        }
        h_log("48 random records: %u connections closed, %u survived", closed, alive);
        CHECK(closed > 0);
        h_bystander_check(&k);
        free(buf);
        h_case_end(&k);
}

/* ---- request-level errors: answered, connection kept ---- */

/* Before hello only ping is answered: other requests are refused (a publish's memfd closed), a wrong version is
 * refused, then hello works, once. */
static void test_hello_first(void)
{
        ProtoMsg list = { .op = PROTO_OP_LIST, .has = PROTO_BIT(PF_OP) };
        ProtoMsg attach = { .op = PROTO_OP_ATTACH,
                            .name = proto_str("bystander/data"),
                            .has = PROTO_BIT(PF_OP) | PROTO_BIT(PF_NAME) };
        ProtoMsg publish = { .op = PROTO_OP_PUBLISH,
                             .name = proto_str("early/bird"),
                             .kind = PROTO_KIND_MEMFD,
                             .size = 4096 };
        ProtoMsg hello = { .op = PROTO_OP_HELLO, .version = PROTO_VERSION };
        int sock, fds_before, memfd;
        HCase k;

        h_case_begin(&k, NULL);
        publish.has = PROTO_BIT(PF_OP) | PROTO_BIT(PF_NAME) | PROTO_BIT(PF_KIND) | PROTO_BIT(PF_SIZE);
        hello.has = PROTO_BIT(PF_OP) | PROTO_BIT(PF_VERSION);
        sock = h_raw_connect(k.broker);
        expect_alive(sock); /* ping is allowed before hello: a readiness probe */
        fds_before = h_broker_fds(k.broker);
        expect_status(sock, &list, -1, PROTO_STATUS_HELLO_FIRST);
        expect_status(sock, &attach, -1, PROTO_STATUS_HELLO_FIRST);
        /* A publish before hello is refused and its memfd closed. */
        memfd = memfd_sealed(4096, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL | F_SEAL_FUTURE_WRITE);
        expect_status(sock, &publish, memfd, PROTO_STATUS_HELLO_FIRST);
        close(memfd);
        WAIT_UNTIL(h_broker_fds(k.broker) == fds_before, H_SOON_MS);
        CHECK_EQ(h_stat(k.obs, "early/bird", &(HStat){ 0 }), GPUIPC_E_NOT_FOUND);
        /* A wrong version is refused, then hello works, once. */
        hello.version = PROTO_VERSION + 1;
        expect_status(sock, &hello, -1, PROTO_STATUS_VERSION);
        hello.version = PROTO_VERSION;
        expect_status(sock, &hello, -1, PROTO_STATUS_OK);
        expect_status(sock, &hello, -1, PROTO_STATUS_STATE);
        expect_status(sock, &list, -1, PROTO_STATUS_OK);
        expect_status(sock, &attach, -1, PROTO_STATUS_OK); /* a reference, dropped with the connection */
        close(sock);
        h_case_end(&k);
}

/* An fd sent with a request that takes none is refused as bad-fd and closed by the broker, and the connection stays
 * usable. */
static void test_fd_on_request_without_fd(void)
{
        static const ProtoOp ops[] = { PROTO_OP_PING,   PROTO_OP_LIST,    PROTO_OP_STATS,
                                       PROTO_OP_ATTACH, PROTO_OP_RELEASE, PROTO_OP_HELLO };
        int sock, fds_before;
        HCase k;

        h_case_begin(&k, NULL);
        sock = raw_peer(&k);
        fds_before = h_broker_fds(k.broker);
        for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++) {
                ProtoMsg m = { .op = ops[i],
                               .name = proto_str("bystander/data"),
                               .buffer = 1,
                               .version = PROTO_VERSION };
                Probe p = probe_new();

                m.has = PROTO_BIT(PF_OP) | PROTO_BIT(PF_NAME) | PROTO_BIT(PF_BUFFER) | PROTO_BIT(PF_VERSION);
                if (ops[i] == PROTO_OP_ATTACH)
                        m.has &= ~PROTO_BIT(PF_BUFFER);
                expect_status(sock, &m, p.wr, PROTO_STATUS_BAD_FD);
                probe_expect_closed(&p, proto_op_name(ops[i]));
                expect_alive(sock);
        }
        /* A memfd the way a buffer would travel, on a request that takes none. */
        {
                ProtoMsg m = { .op = PROTO_OP_PING, .has = PROTO_BIT(PF_OP) };
                int fd = memfd_sealed(1 << 20, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);

                expect_status(sock, &m, fd, PROTO_STATUS_BAD_FD);
                close(fd);
        }
        WAIT_UNTIL(h_broker_fds(k.broker) == fds_before, H_SOON_MS);
        close(sock);
        h_bystander_check(&k);
        h_case_end(&k);
}

/* A publish whose fd is missing or not what its kind needs (a pipe, a socket, an unsealed or wrongly sized memfd,
 * ...) is refused and the broker keeps nothing of it. */
static void test_publish_with_wrong_fd(void)
{
        const int good = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;
        ProtoMsg pub = {
                .op = PROTO_OP_PUBLISH, .name = proto_str("wrong/fd"), .kind = PROTO_KIND_MEMFD, .size = 8192
        };
        int sock, fds_before, sp[2], fd, ro;
        char path[64], byte;
        Probe p;
        HCase k;

        h_case_begin(&k, NULL);
        pub.has = PROTO_BIT(PF_OP) | PROTO_BIT(PF_NAME) | PROTO_BIT(PF_KIND) | PROTO_BIT(PF_SIZE) |
                  PROTO_BIT(PF_WRITABLE);
        sock = raw_peer(&k);
        fds_before = h_broker_fds(k.broker);

        /* No fd at all. */
        expect_status(sock, &pub, -1, PROTO_STATUS_BAD_FD);
        /* A pipe. */
        p = probe_new();
        expect_status(sock, &pub, p.wr, PROTO_STATUS_BAD_FD);
        probe_expect_closed(&p, "pipe as memfd");
        /* A socket, as memfd and as cuda-vmm: refused, and the broker drops its end. */
        for (int i = 0; i < 2; i++) {
                ProtoMsg vmm = pub;

                CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp) == 0);
                if (i) {
                        vmm.kind = PROTO_KIND_CUDA_VMM;
                        vmm.device = proto_str("GPU-00000000-0000-0000-0000-000000000000");
                        proto_set(&vmm, PF_DEVICE);
                }
                expect_status(sock, &vmm, sp[1], PROTO_STATUS_BAD_FD);
                close(sp[1]);
                CHECK(recv(sp[0], &byte, 1, 0) == 0); /* EOF: no other copy of sp[1] is left */
                close(sp[0]);
        }
        /* memfds that break the rules: unsealed, wrong size, read-only without FUTURE_WRITE,
         * writable but sent read-only. */
        fd = memfd_sealed(8192, 0);
        expect_status(sock, &pub, fd, PROTO_STATUS_BAD_FD);
        close(fd);
        fd = memfd_sealed(4096, good);
        expect_status(sock, &pub, fd, PROTO_STATUS_BAD_FD);
        close(fd);
        fd = memfd_sealed(8192, good);
        expect_status(sock, &pub, fd, PROTO_STATUS_BAD_FD);
        pub.writable = true;
        snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
        ro = open(path, O_RDONLY | O_CLOEXEC);
        CHECK(ro >= 0);
        expect_status(sock, &pub, ro, PROTO_STATUS_BAD_FD);
        close(ro);
        /* None of them registered anything or kept an fd. */
        WAIT_UNTIL(h_broker_fds(k.broker) == fds_before, H_SOON_MS);
        CHECK_EQ(h_list_count(k.obs, "wrong/"), 0);
        /* The right fd works on the same connection. */
        expect_status(sock, &pub, fd, PROTO_STATUS_OK);
        close(fd);
        CHECK_EQ(h_list_count(k.obs, "wrong/"), 1);
        CHECK_EQ(h_broker_fds(k.broker), fds_before + 1);
        close(sock); /* its buffer is revoked, its fd closed */
        WAIT_UNTIL(h_list_count(k.obs, "wrong/") == 0, H_SOON_MS);
        h_case_end(&k);
}

/* Requests that are well-formed frames but wrong in substance (missing or conflicting fields, bad names, foreign or
 * unknown ids) get an error reply each and leave the connection open. */
static void test_bad_requests_keep_connection(void)
{
        ProtoMsg m;
        uint8_t frame[256];
        HFrame *f = h_frame_new();
        int sock;
        HCase k;

        h_case_begin(&k, NULL);
        sock = raw_peer(&k);
        /* attach with neither name nor id, and with both */
        m = (ProtoMsg){ .op = PROTO_OP_ATTACH, .has = PROTO_BIT(PF_OP) };
        expect_status(sock, &m, -1, PROTO_STATUS_BAD_REQUEST);
        m = (ProtoMsg){ .op = PROTO_OP_ATTACH, .name = proto_str("x"), .buffer = 1 };
        m.has = PROTO_BIT(PF_OP) | PROTO_BIT(PF_NAME) | PROTO_BIT(PF_BUFFER);
        expect_status(sock, &m, -1, PROTO_STATUS_BAD_REQUEST);
        /* names the registry refuses */
        m = (ProtoMsg){ .op = PROTO_OP_ATTACH, .name = proto_str("../etc/passwd") };
        m.has = PROTO_BIT(PF_OP) | PROTO_BIT(PF_NAME);
        expect_status(sock, &m, -1, PROTO_STATUS_INVALID);
        m.name = proto_str("/abs");
        expect_status(sock, &m, -1, PROTO_STATUS_INVALID);
        m.name = proto_str("sp ace");
        expect_status(sock, &m, -1, PROTO_STATUS_INVALID);
        /* releasing what we do not hold; retiring what is not ours; unknown ids */
        m = (ProtoMsg){ .op = PROTO_OP_RELEASE,
                        .buffer = 12345,
                        .has = PROTO_BIT(PF_OP) | PROTO_BIT(PF_BUFFER) };
        expect_status(sock, &m, -1, PROTO_STATUS_NOT_ATTACHED);
        m.op = PROTO_OP_RETIRE;
        expect_status(sock, &m, -1, PROTO_STATUS_NOT_FOUND);
        m.op = PROTO_OP_UNSUBSCRIBE;
        m.sub = 777;
        m.has = PROTO_BIT(PF_OP) | PROTO_BIT(PF_SUB);
        expect_status(sock, &m, -1, PROTO_STATUS_NOT_FOUND);
        /* a group of zero members, a join without a timeout */
        m = (ProtoMsg){
                .op = PROTO_OP_GROUP_JOIN, .group = proto_str("g"), .members = 0, .timeout_ms = 100
        };
        m.has = PROTO_BIT(PF_OP) | PROTO_BIT(PF_GROUP) | PROTO_BIT(PF_MEMBERS) | PROTO_BIT(PF_TIMEOUT_MS);
        expect_status(sock, &m, -1, PROTO_STATUS_INVALID);
        m.members = 2;
        m.has &= ~PROTO_BIT(PF_TIMEOUT_MS);
        expect_status(sock, &m, -1, PROTO_STATUS_BAD_REQUEST);
        expect_alive(sock);

        /* An op this broker does not know: unknown-op, connection kept. */
        {
                static const uint8_t body[] = { 0x82, 0xa2, 'o', 'p', 0xaa, 'f',  'r', 'o', 'b', 'n',
                                                'i',  'c',  'a', 't', 'e',  0xa2, 'i', 'd', 0x05 };
                frame_header(frame, sizeof(body), 0);
                memcpy(frame + PROTO_HEADER_SIZE, body, sizeof(body));
                CHECK_EQ(h_raw_send(sock, frame, PROTO_HEADER_SIZE + sizeof(body), NULL, 0), 0);
                CHECK_EQ(h_raw_recv(sock, H_SOON_MS, f), 1);
                CHECK_EQ(f->msg.reply, 5);
                CHECK_EQ(f->msg.status, PROTO_STATUS_UNKNOWN_OP);
        }
        /* A known field of the wrong type: bad-request with the request's id, kept. */
        {
                static const uint8_t wrong_type[] = { 0x83, 0xa2, 'o',  'p',  0xa4, 'p', 'i', 'n', 'g', 0xa2,
                                                      'i',  'd',  0x06, 0xa4, 'n',  'a', 'm', 'e', 0x2a };

                frame_header(frame, sizeof(wrong_type), 0);
                memcpy(frame + PROTO_HEADER_SIZE, wrong_type, sizeof(wrong_type));
                CHECK_EQ(h_raw_send(sock, frame, PROTO_HEADER_SIZE + sizeof(wrong_type), NULL, 0), 0);
                CHECK_EQ(h_raw_recv(sock, H_SOON_MS, f), 1);
                CHECK_EQ(f->msg.reply, 6);
                CHECK_EQ(f->msg.status, PROTO_STATUS_BAD_REQUEST);
                CHECK(f->msg.message.len > 0);
        }
        expect_alive(sock);
        /* A request without an id cannot be answered (replies are matched by id): a violation, on a
         * connection of its own. */
        {
                static const uint8_t no_id[] = { 0x81, 0xa2, 'o', 'p', 0xa4, 'p', 'i', 'n', 'g' };
                int lone = h_raw_connect(k.broker);

                frame_header(frame, sizeof(no_id), 0);
                memcpy(frame + PROTO_HEADER_SIZE, no_id, sizeof(no_id));
                CHECK_EQ(h_raw_send(lone, frame, PROTO_HEADER_SIZE + sizeof(no_id), NULL, 0), 0);
                CHECK_EQ(h_raw_recv(lone, H_SOON_MS, f), 1);
                CHECK_EQ(f->msg.reply, 0);
                CHECK_EQ(f->msg.status, PROTO_STATUS_PROTOCOL);
                CHECKF(h_raw_wait_eof(lone, H_SOON_MS), "a request without an id left the connection open");
                close(lone);
        }
        /* Metadata over its 4096-byte limit (one map holding a 4990-byte bin): a field error. */
        {
                size_t meta_len = 1 + 2 + 3 + 4990;
                uint8_t *meta = calloc(1, meta_len);

                CHECK(meta);
                memcpy(meta, "\x81\xa1k\xc5\x13\x7e", 6);
                m = (ProtoMsg){ .op = PROTO_OP_PUBLISH,
                                .name = proto_str("meta/big"),
                                .kind = PROTO_KIND_MEMFD,
                                .size = 4096,
                                .meta = { meta, (uint32_t)meta_len, 1 } };
                m.has = PROTO_BIT(PF_OP) | PROTO_BIT(PF_NAME) | PROTO_BIT(PF_KIND) | PROTO_BIT(PF_SIZE) |
                        PROTO_BIT(PF_META);
                expect_status(sock, &m, -1, PROTO_STATUS_BAD_REQUEST);
                free(meta);
        }
        expect_alive(sock);
        close(sock);
        h_frame_free(f);
        h_bystander_check(&k);
        h_case_end(&k);
}

/* ---- ownership ---- */

typedef struct OwnerArg {
        const HBroker *broker;
        uint64_t live, orphan; /* a live buffer of another peer; a broker-held one whose producer died */
        bool other_uid;
} OwnerArg;

/* Publishes a broker-held buffer, reports 'p' with its id, waits to be killed. */
static int held_producer(HChan *ch, void *arg)
{
        const OwnerArg *a = arg;
        gpuipc_publish_options_t po = { .struct_size = sizeof(po), .broker_held = 1 };
        gpuipc_t *c = h_connect(a->broker, "orphan-producer");
        gpuipc_buffer_t *b = h_publish(c, "orphan/x", 4096, 1, &po);

        h_report(ch, 'p', "%" PRIu64, gpuipc_buffer_id(b));
        h_await(ch, 'x', 120000);
        return 0;
}

/* As another uid (nobody) when started as root: may attach (default policy), may not retire or
 * free what belongs to someone else. */
static int stranger(HChan *ch, void *arg)
{
        const OwnerArg *a = arg;
        ProtoMsg m = { .buffer = a->live, .has = PROTO_BIT(PF_OP) | PROTO_BIT(PF_BUFFER) };
        ProtoMsg att = { .op = PROTO_OP_ATTACH, .name = proto_str("bystander/data") };
        int sock;

        if (a->other_uid) {
                CHECK(setgroups(0, NULL) == 0);
                CHECK(setresgid(65534, 65534, 65534) == 0);
                CHECK(setresuid(65534, 65534, 65534) == 0);
        }
        sock = h_raw_connect(a->broker);
        h_raw_hello(sock);
        m.op = PROTO_OP_RETIRE;
        expect_status(sock, &m, -1, PROTO_STATUS_NOT_OWNER);
        m.op = PROTO_OP_FREE;
        expect_status(sock, &m, -1, PROTO_STATUS_NOT_OWNER);
        if (a->other_uid) {
                m.buffer = a->orphan;
                m.op = PROTO_OP_RETIRE;
                expect_status(sock, &m, -1, PROTO_STATUS_NOT_OWNER);
                m.op = PROTO_OP_FREE;
                expect_status(sock, &m, -1, PROTO_STATUS_NOT_OWNER);
        }
        att.has = PROTO_BIT(PF_OP) | PROTO_BIT(PF_NAME);
        expect_status(sock, &att, -1, PROTO_STATUS_OK);
        close(sock);
        h_report(ch, 'd', "done");
        return 0;
}

/* Another uid can neither retire nor free a live buffer, nor an orphaned broker-held one, yet may still attach; the
 * orphan's own uid then retires it. */
static void test_other_uid_cannot_manage(void)
{
        static const char *const flags[] = { "--socket-mode", "0666", NULL };
        OwnerArg arg = { 0 };
        HChild *prod, *peer, *retire;
        char dir[sizeof(((HBroker *)0)->dir)], up[sizeof(dir)], text[64];
        HStat st;
        HCase k;

        h_case_begin(&k, flags);
        /* root may manage every uid's buffers (the default policy's admin): act as nobody. */
        arg.broker = k.broker;
        arg.live = gpuipc_buffer_id(k.by_buf);
        arg.other_uid = geteuid() == 0;
        if (arg.other_uid) {
                snprintf(dir, sizeof(dir), "%s", k.broker->dir);
                for (int i = 0; i < 3; i++) {
                        CHECKF(chmod(dir, 0711) == 0, "chmod %s: %s", dir, strerror(errno));
                        snprintf(up, sizeof(up), "%s", dir);
                        snprintf(dir, sizeof(dir), "%s", dirname(up));
                }
                prod = h_spawn("orphan-producer", held_producer, &arg);
                h_child_expect(prod, 'p', H_SOON_MS, text, sizeof(text));
                arg.orphan = strtoull(text, NULL, 10);
                h_child_kill9(prod);
                h_child_free(prod);
                WAIT_UNTIL(h_stats(k.obs, "buffers_orphaned") == 1, H_SOON_MS);
        }
        peer = h_spawn("stranger", stranger, &arg);
        h_child_expect(peer, 'd', H_SOON_MS, NULL, 0);
        h_child_wait_ok(peer, H_SOON_MS);
        h_child_free(peer);
        if (arg.other_uid) {
                /* Still there; its own uid retires it, and then it is gone. */
                CHECK_OK(k.obs, h_stat_id(k.obs, arg.orphan, &st));
                CHECK_EQ(st.state, PROTO_STATE_LIVE);
                retire = h_spawn_ctl(k.broker, "ctl-retire", "retire", "orphan/x", NULL);
                h_child_wait_ok(retire, H_SOON_MS);
                h_child_free(retire);
                WAIT_UNTIL(h_stat_id(k.obs, arg.orphan, &st) == GPUIPC_E_NOT_FOUND, H_SOON_MS);
        }
        h_case_end(&k);
}

int main(int argc, char **argv)
{
        static const HTest tests[] = {
                H_TEST(test_malformed_msgpack),
                H_TEST(test_oversized_frame),
                H_TEST(test_fd_count_mismatch),
                H_TEST(test_wrong_magic_and_version),
                H_TEST(test_not_a_request),
                H_TEST(test_zero_length_record),
                H_TEST(test_random_bytes),
                H_TEST(test_hello_first),
                H_TEST(test_fd_on_request_without_fd),
                H_TEST(test_publish_with_wrong_fd),
                H_TEST(test_bad_requests_keep_connection),
                H_TEST(test_other_uid_cannot_manage),
        };

        return h_main(argc, argv, tests, sizeof(tests) / sizeof(tests[0]));
}
