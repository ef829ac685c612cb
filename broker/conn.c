/* Non-blocking SOCK_SEQPACKET I/O with fd passing (after wayland's connection.c: CLOEXEC on
 * receive, surplus and unexpected fds closed, every length checked). */
#include "conn.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
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

void conn_init(Conn *c, int fd)
{
        c->fd = fd;
        list_init(&c->out);
        c->queued_bytes = 0;
        c->queued_fds = 0;
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
}

int conn_recv(Conn *c, uint8_t *buf, size_t cap, size_t *ret_len, int *fds, size_t *ret_n_fds)
{
        size_t n_fds = 0;
        int truncated = 0;
        ssize_t n;

        n = fdpass_recv(c->fd, buf, cap, fds, CONN_MAX_RECV_FDS, &n_fds, &truncated);
        if (n == -EAGAIN)
                return CONN_E_AGAIN;
        if (n < 0)
                return (int)n;
        if (n == 0 && n_fds == 0)
                return CONN_E_EOF;
        if (truncated) {
                for (size_t i = 0; i < n_fds; i++)
                        safe_close(fds[i]);
                return CONN_E_TRUNC;
        }
        *ret_len = (size_t)n;
        *ret_n_fds = n_fds;
        return 0;
}

/* One sendmsg of a whole record. 0, CONN_E_AGAIN or -errno. */
static int send_record(int sock, const uint8_t *data, size_t len, int fd)
{
        int r = fdpass_send(sock, data, len, fd);

        return r == -EAGAIN ? CONN_E_AGAIN : r;
}

int conn_send(Conn *c, ProtoBuf *frame, int fd)
{
        OutMsg *m;
        int r;

        if (list_empty(&c->out)) {
                r = send_record(c->fd, frame->data, frame->len, fd);
                if (r != CONN_E_AGAIN) {
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
        return 0;
}

int conn_flush(Conn *c)
{
        while (!list_empty(&c->out)) {
                OutMsg *m = list_entry(c->out.next, OutMsg, link);
                int r = send_record(c->fd, m->data, m->len, m->fd);

                if (r)
                        return r;
                c->queued_bytes -= OUTMSG_COST(m->len);
                if (m->fd >= 0)
                        c->queued_fds--;
                outmsg_free(m);
        }
        return 0;
}
