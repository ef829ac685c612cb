/* Non-blocking SOCK_SEQPACKET I/O with fd passing (after wayland's connection.c: CLOEXEC on
 * receive, surplus and unexpected fds closed, every length checked), and the account of fds a
 * peer has not received.
 *
 * What it must never do: block (a record the socket will not take now waits in the queue), leave
 * a received fd that nobody owns open, or judge what a record says (proto_frame_decode does, in
 * peer.c). */
#include "conn.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/sockios.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fdpass.h"
#include "macro.h"

/* A frame waiting for room in the socket, its bytes inline: one allocation of exactly what it
 * needs, so that the queue's accounting is the memory it really holds. */
typedef struct OutMsg {
        List link;
        int fd; /* owned dup, or -1 */
        size_t len;
        uint8_t data[];
} OutMsg;

/* What a queued message costs, counted against --max-queued-bytes: its bytes plus its header and
 * the allocator's own overhead, so a flood of tiny replies is bounded as tightly as big ones. */
#define OUTMSG_COST(len) ((len) + sizeof(OutMsg) + 2 * sizeof(size_t))

/* The kernel charges a record in a peer's receive queue at least its length plus its socket
 * buffer's bookkeeping (struct sk_buff and skb_shared_info: well over 256 bytes on every kernel).
 * Counting each record at this lower bound keeps the estimate of unread fds an upper bound. */
#define RECORD_MIN_CHARGE(len) ((uint64_t)(len) + 256)

void conn_init(Conn *c, int fd, uint32_t max_unreceived)
{
        /* At least one: the ring of unread fd positions is indexed modulo this. */
        *c = (Conn){ .fd = fd, .max_unreceived = max_unreceived ? max_unreceived : 1 };
        list_init(&c->out);
}

static void outmsg_free(OutMsg *m)
{
        list_unlink(&m->link);
        safe_close(m->fd);
        free(m);
}

void conn_deinit(Conn *c)
{
        while (!list_empty(&c->out))
                outmsg_free(list_entry(c->out.next, OutMsg, link));
        c->queued_bytes = c->queued_fds = 0;
        c->fd = safe_close(c->fd);
        free(c->unread_at);
        c->unread_at = NULL;
        c->n_unread = 0;
}

int conn_recv(Conn *c, uint8_t *buf, size_t cap, size_t *ret_len, int *fds, size_t *ret_n_fds, bool *ret_truncated)
{
        size_t n_fds = 0;
        int truncated = 0;
        ssize_t n;

        n = fdpass_recv(c->fd, buf, cap, fds, CONN_MAX_RECV_FDS, &n_fds, &truncated);
        if (n == -EAGAIN)
                return CONN_E_AGAIN;
        if (n < 0)
                return (int)n;
        /* A SEQPACKET record of 0 bytes is legal and may carry fds; only 0 bytes and no fds is
         * the peer's end of stream. */
        if (n == 0 && n_fds == 0)
                return CONN_E_EOF;
        *ret_len = (size_t)n;
        *ret_n_fds = n_fds;
        *ret_truncated = truncated;
        return 0;
}

/* One sendmsg of a whole record. 0, CONN_E_AGAIN, CONN_E_BLOCKED or -errno. */
static int send_record(int sock, const uint8_t *data, size_t len, int fd)
{
        int r = fdpass_send(sock, data, len, fd);

        /* ETOOMANYREFS: the kernel's in-flight fd limit for our uid, not this peer's fault (peer.c
         * retries it on a timer), unlike a full socket (EAGAIN), which waits for POLLOUT. */
        return r == -EAGAIN ? CONN_E_AGAIN : r == -ETOOMANYREFS ? CONN_E_BLOCKED : r;
}

/* A record went to the kernel: remember where an fd-carrying one starts. */
static void note_sent(Conn *c, size_t len, bool with_fd)
{
        if (with_fd) {
                c->unread_at[(c->unread_head + c->n_unread) % c->max_unreceived] = c->sent_lb;
                c->n_unread++;
        }
        c->sent_lb += RECORD_MIN_CHARGE(len);
}

/* Forgets the fds the peer has certainly read. SIOCOUTQ is what the kernel still charges for our
 * records in the peer's receive queue, and those are the newest records: if the lower-bound charge
 * from a record to the newest one exceeds it, that record has been read. */
static void forget_read(Conn *c)
{
        int outq;

        if (!c->n_unread || ioctl(c->fd, SIOCOUTQ, &outq) < 0 || outq < 0)
                return;
        while (c->n_unread && c->sent_lb - c->unread_at[c->unread_head] > (uint64_t)outq) {
                c->unread_head = (c->unread_head + 1) % c->max_unreceived;
                c->n_unread--;
        }
}

size_t conn_unreceived_fds(Conn *c)
{
        forget_read(c);
        return c->n_unread + c->queued_fds;
}

int conn_send(Conn *c, ProtoBuf *frame, int fd)
{
        OutMsg *m;
        int r;

        if (fd >= 0) {
                /* Checked before anything is sent, so the kernel never holds more than the limit. */
                if (conn_unreceived_fds(c) >= c->max_unreceived) {
                        proto_buf_free(frame);
                        return CONN_E_UNRECEIVED;
                }
                if (!c->unread_at && !(c->unread_at = calloc(c->max_unreceived, sizeof(*c->unread_at)))) {
                        proto_buf_free(frame);
                        return -ENOMEM;
                }
        }
        r = 0;
        /* Straight to the socket only when nothing waits: a frame must never overtake the ones
         * queued before it. */
        if (list_empty(&c->out)) {
                r = send_record(c->fd, frame->data, frame->len, fd);
                if (r != CONN_E_AGAIN && r != CONN_E_BLOCKED) {
                        if (r == 0)
                                note_sent(c, frame->len, fd >= 0);
                        proto_buf_free(frame);
                        return r;
                }
        }
        m = malloc(sizeof(*m) + frame->len);
        if (!m) {
                proto_buf_free(frame);
                return -ENOMEM;
        }
        m->fd = -1;
        if (fd >= 0) {
                /* A dup of our own: the outbox closes its fd after delivery, while this frame may
                 * wait in the queue much longer. At 3 or above, never a standard stream. */
                m->fd = fcntl(fd, F_DUPFD_CLOEXEC, 3);
                if (m->fd < 0) {
                        r = -errno;
                        proto_buf_free(frame);
                        free(m);
                        return r;
                }
                c->queued_fds++;
        }
        m->len = frame->len;
        memcpy(m->data, frame->data, frame->len);
        proto_buf_free(frame);
        list_init(&m->link);
        list_append(&c->out, &m->link);
        c->queued_bytes += OUTMSG_COST(m->len);
        return r == CONN_E_BLOCKED ? CONN_E_BLOCKED : 0;
}

int conn_flush(Conn *c)
{
        while (!list_empty(&c->out)) {
                OutMsg *m = list_entry(c->out.next, OutMsg, link);
                int r = send_record(c->fd, m->data, m->len, m->fd);

                if (r)
                        return r;
                note_sent(c, m->len, m->fd >= 0);
                c->queued_bytes -= OUTMSG_COST(m->len);
                if (m->fd >= 0)
                        c->queued_fds--;
                outmsg_free(m);
        }
        return 0;
}

int conn_send_last(Conn *c, ProtoBuf *frame)
{
        int r;

        while (!list_empty(&c->out))
                outmsg_free(list_entry(c->out.next, OutMsg, link));
        c->queued_bytes = c->queued_fds = 0;
        r = send_record(c->fd, frame->data, frame->len, -1);
        if (r == CONN_E_AGAIN || r == CONN_E_BLOCKED) {
                /* The socket is full of what the peer has not read. Asking for the largest send
                 * buffer (net.core.wmem_max, which the kernel doubles) leaves room above the default
                 * one for this frame, queued after everything the peer has yet to read. */
                int most = INT_MAX;

                if (setsockopt(c->fd, SOL_SOCKET, SO_SNDBUF, &most, sizeof(most)) == 0)
                        r = send_record(c->fd, frame->data, frame->len, -1);
        }
        proto_buf_free(frame);
        return r > 0 ? -EAGAIN : r;
}
