/* Where the broker and docs/protocol.md once disagreed, the broker now does what the document says:
 * a header with reserved bytes set is named as such; a field error without a readable id closes
 * the connection (no reply could be matched to it); a handle on a memfd publish is invalid; stat
 * pages its holders; waiters that lose a retire_after race time out saying so; group-join asks the
 * policy; a name over 255 bytes is bad-request. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "harness.h"
#include "macro.h"

static bool message_has(const HFrame *f, const char *what)
{
        return f->msg.message.len && memmem(f->msg.message.ptr, f->msg.message.len, what, strlen(what));
}

/* Receives until a failed reply with reply 0, then requires end-of-file. */
static void expect_protocol_close(int sock, const char *what)
{
        HFrame *f = h_frame_new();
        int r;

        while ((r = h_raw_recv(sock, H_SOON_MS, f)) == 1 && !(f->msg.type == PROTO_REPLY && f->msg.reply == 0))
                ;
        CHECKF(r == 1, "no reply 0 before the connection ended");
        CHECK_EQ(f->msg.status, PROTO_STATUS_PROTOCOL);
        CHECKF(message_has(f, what), "the protocol notice does not say '%s': %.*s", what, (int)f->msg.message.len,
               f->msg.message.ptr);
        CHECKF(h_raw_wait_eof(sock, H_SOON_MS), "the connection stayed open");
        h_frame_free(f);
}

/* A frame with a reserved header byte set closes the connection with a protocol error. */
static void test_reserved_header_bytes(void)
{
        ProtoMsg ping = { .op = PROTO_OP_PING, .id = 1, .has = PROTO_BIT(PF_OP) | PROTO_BIT(PF_ID) };
        ProtoBuf frame = { 0 };
        HCase k;
        int sock;

        h_case_begin(&k, NULL);
        sock = h_raw_connect(k.broker);
        CHECK_EQ(proto_frame_encode(&frame, &ping, 0), 0);
        frame.data[7] = 1;
        CHECK_EQ(h_raw_send(sock, frame.data, frame.len, NULL, 0), 0);
        expect_protocol_close(sock, "reserved bytes");
        close(sock);
        proto_buf_free(&frame);
        h_case_end(&k);
}

/* Sends one frame whose body is given as bytes. */
static void send_body(int sock, const uint8_t *body, size_t len)
{
        uint8_t frame[PROTO_HEADER_SIZE + 64];

        CHECK(len <= 64);
        proto_header_write(frame, (uint32_t)len, 0);
        memcpy(frame + PROTO_HEADER_SIZE, body, len);
        CHECK_EQ(h_raw_send(sock, frame, PROTO_HEADER_SIZE + len, NULL, 0), 0);
}

/* {"op": "attach", "name": 5}: a field error, and no id to answer it with. With an id the same
 * error is an ordinary bad-request answered with it, and the connection stays. */
static void test_field_error_without_id_closes(void)
{
        static const uint8_t no_id[] = { 0x82, 0xa2, 'o', 'p', 0xa6, 'a', 't', 't', 'a', 'c', 'h',
                                         0xa4, 'n', 'a', 'm', 'e', 0x05 };
        static const uint8_t with_id[] = { 0x83, 0xa2, 'o', 'p', 0xa6, 'a', 't', 't', 'a', 'c', 'h',
                                           0xa4, 'n', 'a', 'm', 'e', 0x05, 0xa2, 'i', 'd', 77 };
        ProtoMsg ping = { .op = PROTO_OP_PING, .has = PROTO_BIT(PF_OP) };
        HFrame *f = h_frame_new();
        HCase k;
        int sock;

        h_case_begin(&k, NULL);
        sock = h_raw_connect(k.broker);
        h_raw_hello(sock);
        send_body(sock, no_id, sizeof(no_id));
        expect_protocol_close(sock, "no readable id");
        close(sock);
        sock = h_raw_connect(k.broker);
        h_raw_hello(sock);
        send_body(sock, with_id, sizeof(with_id));
        CHECK_EQ(h_raw_recv(sock, H_SOON_MS, f), 1);
        CHECK_EQ(f->msg.reply, 77);
        CHECK_EQ(f->msg.status, PROTO_STATUS_BAD_REQUEST);
        CHECKF(message_has(f, "'name'"), "the message does not name the field");
        CHECK_EQ(h_raw_call(sock, &ping, -1, f), PROTO_STATUS_OK);
        close(sock);
        h_frame_free(f);
        h_case_end(&k);
}

static int sealed_memfd(size_t size)
{
        int fd = memfd_create("protocol-test", MFD_CLOEXEC | MFD_ALLOW_SEALING);

        CHECK(fd >= 0 && ftruncate(fd, (off_t)size) == 0);
        CHECK(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL | 0x10 /* FUTURE_WRITE */) == 0);
        return fd;
}

/* A publish carrying an IPC handle for a kind other than cuda-legacy is refused as invalid, saying handles are for
 * cuda-legacy. */
static void test_handle_only_for_cuda_legacy(void)
{
        static const uint8_t handle[PROTO_LEGACY_HANDLE_SIZE] = { 1, 2, 3 };
        ProtoMsg publish = { .op = PROTO_OP_PUBLISH, .name = proto_str("proto/handle"), .kind = PROTO_KIND_MEMFD,
                             .size = 4096 };
        HFrame *f = h_frame_new();
        HCase k;
        int sock, fd;

        h_case_begin(&k, NULL);
        sock = h_raw_connect(k.broker);
        h_raw_hello(sock);
        fd = sealed_memfd(4096);
        publish.handle = (ProtoStr){ (const char *)handle, sizeof(handle) };
        publish.has = PROTO_BIT(PF_OP) | PROTO_BIT(PF_NAME) | PROTO_BIT(PF_KIND) | PROTO_BIT(PF_SIZE) |
                      PROTO_BIT(PF_HANDLE);
        CHECK_EQ(h_raw_call(sock, &publish, fd, f), PROTO_STATUS_INVALID);
        CHECKF(message_has(f, "cuda-legacy"), "the refusal does not say handles are for cuda-legacy");
        close(fd);
        close(sock);
        h_frame_free(f);
        h_case_end(&k);
}

/* A name of 256 bytes (built by hand: the encoder refuses it) is answered with an error naming the field and saying
 * it is too long. */
static void test_name_over_255_bytes(void)
{
        char name[257];
        HFrame *f = h_frame_new();
        HCase k;
        int sock;

        h_case_begin(&k, NULL);
        sock = h_raw_connect(k.broker);
        h_raw_hello(sock);
        memset(name, 'n', 256);
        name[256] = 0;
        /* The encoder refuses such a name: the body is built by hand. */
        {
                ProtoBuf body = { 0 };
                uint8_t hdr[PROTO_HEADER_SIZE];
                static const uint8_t start[] = { 0x83, 0xa2, 'o', 'p', 0xa6, 'a', 't', 't', 'a', 'c', 'h',
                                                 0xa2, 'i', 'd', 0x09, 0xa4, 'n', 'a', 'm', 'e', 0xda, 0x01, 0x00 };

                CHECK_EQ(proto_buf_append(&body, hdr, sizeof(hdr)), 0);
                CHECK_EQ(proto_buf_append(&body, start, sizeof(start)), 0);
                CHECK_EQ(proto_buf_append(&body, name, 256), 0);
                proto_header_write(body.data, (uint32_t)(body.len - PROTO_HEADER_SIZE), 0);
                CHECK_EQ(h_raw_send(sock, body.data, body.len, NULL, 0), 0);
                proto_buf_free(&body);
        }
        while (h_raw_recv(sock, H_SOON_MS, f) == 1 && f->msg.type != PROTO_REPLY)
                ;
        CHECK_EQ(f->msg.reply, 9);
        CHECK_EQ(f->msg.status, PROTO_STATUS_BAD_REQUEST);
        CHECKF(message_has(f, "'name'") && message_has(f, "too long"), "the message: %.*s",
               (int)f->msg.message.len, f->msg.message.ptr);
        close(sock);
        h_frame_free(f);
        h_case_end(&k);
}

/* ---- stat pages its holders ---- */

/* stat pages through 40 holders 16 at a time, in increasing peer order with none repeated, and a name the broker
 * would never publish is invalid rather than absent. */
static void test_stat_pages_holders(void)
{
        enum { HOLDERS = 40, PAGE = 16 };
        int socks[HOLDERS], seen = 0;
        uint64_t after = 0, last = 0;
        gpuipc_buffer_t *b;
        HFrame *f = h_frame_new();
        HCase k;
        bool more = true;

        h_case_begin(&k, NULL);
        b = h_publish(k.by_prod, "proto/held", 4096, 3, NULL);
        for (int i = 0; i < HOLDERS; i++) {
                ProtoMsg attach = { .op = PROTO_OP_ATTACH, .buffer = gpuipc_buffer_id(b) };

                socks[i] = h_raw_connect(k.broker);
                h_raw_hello(socks[i]);
                attach.has = PROTO_BIT(PF_OP) | PROTO_BIT(PF_BUFFER);
                CHECK_EQ(h_raw_call(socks[i], &attach, -1, f), PROTO_STATUS_OK);
        }
        {
                /* A name the broker would never publish is invalid, not merely absent. */
                ProtoMsg bad = { .op = PROTO_OP_STAT, .name = proto_str("../x"),
                                 .has = PROTO_BIT(PF_OP) | PROTO_BIT(PF_NAME) };

                CHECK_EQ(h_raw_call(socks[0], &bad, -1, f), PROTO_STATUS_INVALID);
        }
        while (more) {
                ProtoMsg stat = { .op = PROTO_OP_STAT, .buffer = gpuipc_buffer_id(b), .after = after, .limit = PAGE };
                int sock = h_raw_connect(k.broker), n = 0;
                ProtoIter it;
                ProtoMsg rec;

                h_raw_hello(sock);
                stat.has = PROTO_BIT(PF_OP) | PROTO_BIT(PF_BUFFER) | PROTO_BIT(PF_AFTER) | PROTO_BIT(PF_LIMIT);
                CHECK_EQ(h_raw_call(sock, &stat, -1, f), PROTO_STATUS_OK);
                CHECK_EQ(f->msg.holders, HOLDERS);
                proto_iter_init(&it, &f->msg.items);
                while (proto_iter_next(&it, &rec) == 1) {
                        CHECKF(rec.peer > last, "holders out of order or repeated: %llu after %llu",
                               (unsigned long long)rec.peer, (unsigned long long)last);
                        last = rec.peer;
                        n++;
                }
                CHECK(n <= PAGE);
                more = f->msg.more;
                CHECK(proto_has(&f->msg, PF_AFTER));
                CHECK_EQ(f->msg.after, n ? last : after);
                after = f->msg.after;
                seen += n;
                close(sock);
        }
        CHECK_EQ(seen, HOLDERS);
        for (int i = 0; i < HOLDERS; i++)
                close(socks[i]);
        h_frame_free(f);
        h_case_end(&k);
}

/* ---- waiters that lose a retire_after race ---- */

/* With retire_after=1 and three waiters, one is served and the others fail saying the buffer was retired before
 * their turn (not that nothing was published). */
static void test_retire_after_waiters_time_out_saying_why(void)
{
        enum { WAITERS = 3 };
        gpuipc_publish_options_t once = { .struct_size = sizeof(once), .retire_after = 1 };
        int socks[WAITERS], served = 0, told = 0;
        HFrame *f = h_frame_new();
        gpuipc_t *prod;
        HCase k;

        h_case_begin(&k, NULL);
        prod = h_connect(k.broker, "once-producer");
        for (int i = 0; i < WAITERS; i++) {
                ProtoMsg attach = { .op = PROTO_OP_ATTACH, .id = 100 + (uint64_t)i, .name = proto_str("proto/once"),
                                    .timeout_ms = 400 };

                socks[i] = h_raw_connect(k.broker);
                h_raw_hello(socks[i]);
                attach.has = PROTO_BIT(PF_OP) | PROTO_BIT(PF_ID) | PROTO_BIT(PF_NAME) | PROTO_BIT(PF_TIMEOUT_MS);
                CHECK_EQ(h_raw_send_msg(socks[i], &attach, 0, NULL, 0), 0);
        }
        WAIT_UNTIL(h_stats(k.obs, "waits") == WAITERS, H_SOON_MS);
        h_publish(prod, "proto/once", 4096, 4, &once);
        for (int i = 0; i < WAITERS; i++) {
                do
                        CHECK_EQ(h_raw_recv(socks[i], H_SOON_MS, f), 1);
                while (f->msg.type != PROTO_REPLY);
                if (f->msg.status == PROTO_STATUS_OK) {
                        served++;
                } else {
                        CHECK_EQ(f->msg.status, PROTO_STATUS_TIMEOUT);
                        CHECKF(!message_has(f, "nothing was published"), "a waiter that saw the publish is told "
                               "nothing was published: %.*s", (int)f->msg.message.len, f->msg.message.ptr);
                        told += message_has(f, "retired before its turn");
                }
                close(socks[i]);
        }
        CHECK_EQ(served, 1);
        CHECK_EQ(told, WAITERS - 1);
        gpuipc_close(prod);
        h_frame_free(f);
        h_case_end(&k);
}

/* ---- group-join asks the policy ---- */

/* Group names are under the policy like buffer names: joining a group the policy does not allow is denied, naming
 * the group. */
static void test_group_join_policy(void)
{
        char policy[256];
        const char *flags[] = { "--policy", policy, NULL };
        ProtoMsg join = { .op = PROTO_OP_GROUP_JOIN, .members = 1, .timeout_ms = 1000 };
        HFrame *f = h_frame_new();
        HCase k;
        FILE *pf;
        int sock;

        snprintf(policy, sizeof(policy), "%s/policy.conf", h_case_dir());
        pf = fopen(policy, "we");
        CHECK(pf);
        fputs("allow all any prefix=bystander/\nallow attach any prefix=ok-\n", pf);
        fclose(pf);
        h_case_begin(&k, flags);
        sock = h_raw_connect(k.broker);
        h_raw_hello(sock);
        join.has = PROTO_BIT(PF_OP) | PROTO_BIT(PF_GROUP) | PROTO_BIT(PF_MEMBERS) | PROTO_BIT(PF_TIMEOUT_MS);
        join.group = proto_str("other-group");
        CHECK_EQ(h_raw_call(sock, &join, -1, f), PROTO_STATUS_DENIED);
        CHECKF(message_has(f, "other-group"), "the denial does not name the group");
        join.group = proto_str("ok-group");
        CHECK_EQ(h_raw_call(sock, &join, -1, f), PROTO_STATUS_OK);
        close(sock);
        h_frame_free(f);
        h_case_end(&k);
}

int main(int argc, char **argv)
{
        static const HTest tests[] = {
                H_TEST(test_reserved_header_bytes),
                H_TEST(test_field_error_without_id_closes),
                H_TEST(test_handle_only_for_cuda_legacy),
                H_TEST(test_name_over_255_bytes),
                H_TEST(test_stat_pages_holders),
                H_TEST(test_retire_after_waiters_time_out_saying_why),
                H_TEST(test_group_join_policy),
        };

        return h_main(argc, argv, tests, sizeof(tests) / sizeof(tests[0]));
}
