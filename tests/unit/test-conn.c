/* broker/conn.c over a socketpair: the count of fds a peer has not received (estimated from
 * SIOCOUTQ: never too low, and back to zero once the peer read everything), the bound on it,
 * frames that wait in the queue, and the last frame to a peer whose socket is full. */
#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check.h"
#include "conn.h"
#include "fdpass.h"

static int memfd(void)
{
        int fd = memfd_create("test-conn", MFD_CLOEXEC);

        CHECK(fd >= 0);
        return fd;
}

/* A small frame (a ping reply), or one padded with a long message to len bytes. */
static ProtoBuf frame_of(size_t len)
{
        static char text[PROTO_MAX_TEXT];
        ProtoMsg m = { .reply = 1, .status = 0, .has = PROTO_BIT(PF_REPLY) | PROTO_BIT(PF_STATUS) };
        ProtoBuf b = { 0 };

        if (len) {
                memset(text, 'x', sizeof(text));
                m.message = (ProtoStr){ text, (uint32_t)(len < sizeof(text) ? len : sizeof(text)) };
                proto_set(&m, PF_MESSAGE);
        }
        CHECK_EQ(proto_frame_encode(&b, &m, 0), 0);
        return b;
}

static int send_frame(Conn *c, size_t len, int fd)
{
        ProtoBuf b = frame_of(len);
        return conn_send(c, &b, fd);
}

/* Reads one record on the peer's end; returns whether it carried an fd (closed at once). */
static bool peer_read(int sock)
{
        uint8_t buf[PROTO_MAX_FRAME];
        int fds[4];
        size_t n_fds = 0;
        int truncated = 0;
        ssize_t n = fdpass_recv(sock, buf, sizeof(buf), fds, 4, &n_fds, &truncated);

        CHECK(n > 0 && !truncated);
        for (size_t i = 0; i < n_fds; i++)
                close(fds[i]);
        return n_fds > 0;
}

static void pair(int sv[2])
{
        CHECK(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) == 0);
}

/* A connection counts the fds its peer has not received yet and refuses a frame that would pass the limit (frames
 * without fds still go); the count follows the peer's reads. */
static void test_unreceived_fds_counted_and_bounded(void)
{
        int sv[2], fd = memfd();
        Conn c;

        pair(sv);
        conn_init(&c, sv[0], 4);
        CHECK_EQ(conn_unreceived_fds(&c), 0);
        for (int i = 0; i < 4; i++) {
                CHECK_EQ(send_frame(&c, 0, fd), 0);
                CHECK_EQ(send_frame(&c, 200, -1), 0); /* frames without fds in between */
        }
        CHECK_EQ(conn_unreceived_fds(&c), 4);
        /* A fifth would leave the peer more than the limit unreceived: refused, nothing sent. */
        CHECK_EQ(send_frame(&c, 0, fd), CONN_E_UNRECEIVED);
        CHECK_EQ(conn_unreceived_fds(&c), 4);
        CHECK_EQ(send_frame(&c, 0, -1), 0); /* frames without fds still go */
        /* As the peer reads, the count follows: never below what is really unread. */
        CHECK(peer_read(sv[1]));
        CHECK(!peer_read(sv[1]));
        CHECK(conn_unreceived_fds(&c) >= 3);
        CHECK(peer_read(sv[1]));
        CHECK(!peer_read(sv[1]));
        CHECK(conn_unreceived_fds(&c) >= 2);
        for (int i = 0; i < 5; i++)
                peer_read(sv[1]);
        CHECK_EQ(conn_unreceived_fds(&c), 0);
        CHECK_EQ(send_frame(&c, 0, fd), 0);
        CHECK_EQ(conn_unreceived_fds(&c), 1);
        conn_deinit(&c);
        close(sv[1]);
        close(fd);
}

/* Only the newest records can be unread: a reader that keeps up leaves at most a few fds
 * counted, however many went through. */
static void test_estimate_tracks_a_reader(void)
{
        int sv[2], fd = memfd();
        Conn c;

        pair(sv);
        conn_init(&c, sv[0], 8);
        for (int i = 0; i < 1000; i++) {
                CHECK_EQ(send_frame(&c, (size_t)(i % 700), i % 3 ? -1 : fd), 0);
                CHECK(conn_unreceived_fds(&c) <= 1);
                peer_read(sv[1]);
        }
        CHECK_EQ(conn_unreceived_fds(&c), 0);
        conn_deinit(&c);
        close(sv[1]);
        close(fd);
}

/* When the socket is full, frames wait in the queue, and their fds count too. */
static void test_queued_fds_count(void)
{
        int sv[2], fd = memfd(), small = 4096, sent = 0;
        Conn c;

        pair(sv);
        CHECK(setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &small, sizeof(small)) == 0);
        conn_init(&c, sv[0], 64);
        while (!conn_pending(&c)) {
                CHECK_EQ(send_frame(&c, 1000, -1), 0);
                CHECK(++sent < 10000);
        }
        CHECK_EQ(send_frame(&c, 0, fd), 0);
        CHECK_EQ(c.queued_fds, 1);
        CHECK_EQ(conn_unreceived_fds(&c), 1);
        /* The peer reads everything; flushing moves the queued fd into the socket. */
        while (conn_pending(&c)) {
                while (true) {
                        uint8_t buf[PROTO_MAX_FRAME];
                        int fds[2];
                        size_t n_fds;
                        int tr;

                        if (fdpass_recv(sv[1], buf, sizeof(buf), fds, 2, &n_fds, &tr) < 0)
                                break;
                        for (size_t i = 0; i < n_fds; i++)
                                close(fds[i]);
                }
                CHECK(conn_flush(&c) >= 0);
        }
        CHECK_EQ(c.queued_fds, 0);
        CHECK(conn_unreceived_fds(&c) <= 1);
        while (true) {
                uint8_t buf[PROTO_MAX_FRAME];
                int fds[2];
                size_t n_fds;
                int tr;

                if (fdpass_recv(sv[1], buf, sizeof(buf), fds, 2, &n_fds, &tr) < 0)
                        break;
                for (size_t i = 0; i < n_fds; i++)
                        close(fds[i]);
        }
        CHECK_EQ(conn_unreceived_fds(&c), 0);
        conn_deinit(&c);
        close(sv[1]);
        close(fd);
}

/* The last frame to a peer that stopped reading gets through a full socket, after what it holds. */
static void test_last_frame_through_full_socket(void)
{
        static const char last[] = "the broker disconnects this connection";
        ProtoMsg m = { .status = PROTO_STATUS_QUOTA, .message = { last, sizeof(last) - 1 } };
        uint8_t buf[PROTO_MAX_FRAME];
        int sv[2], fds[2], tr, frames = 0;
        ProtoBuf b = { 0 };
        size_t n_fds, last_len = 0;
        ssize_t n;
        Conn c;

        pair(sv);
        conn_init(&c, sv[0], 8);
        while (!conn_pending(&c))
                CHECK_EQ(send_frame(&c, 1000, -1), 0);
        m.has = PROTO_BIT(PF_REPLY) | PROTO_BIT(PF_STATUS) | PROTO_BIT(PF_MESSAGE);
        CHECK_EQ(proto_frame_encode(&b, &m, 0), 0);
        CHECK_EQ(conn_send_last(&c, &b), 0);
        CHECK(!conn_pending(&c)); /* what was queued is dropped */
        while ((n = fdpass_recv(sv[1], buf, sizeof(buf), fds, 2, &n_fds, &tr)) > 0) {
                last_len = (size_t)n;
                frames++;
        }
        CHECK(frames > 1);
        CHECK(memmem(buf, last_len, last, sizeof(last) - 1) != NULL); /* the last record read */
        conn_deinit(&c);
        close(sv[1]);
}

int main(int argc, char **argv)
{
        TEST_RUN(argc, argv, test_unreceived_fds_counted_and_bounded);
        TEST_RUN(argc, argv, test_estimate_tracks_a_reader);
        TEST_RUN(argc, argv, test_queued_fds_count);
        TEST_RUN(argc, argv, test_last_frame_through_full_socket);
        return TEST_END();
}
