/* Non-blocking SOCK_SEQPACKET I/O with fd passing (after wayland's connection.c: CLOEXEC on
 * receive, surplus and unexpected fds closed, every length checked). */
#include "conn.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

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

/* Collects the SCM_RIGHTS fds of a received message; anything else in the control data is
 * ignored (we never ask for credentials messages). Returns the number stored in fds. */
static size_t collect_fds(struct msghdr *mh, int *fds)
{
        size_t n = 0;

        for (struct cmsghdr *cm = CMSG_FIRSTHDR(mh); cm; cm = CMSG_NXTHDR(mh, cm)) {
                size_t count;

                if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
                        continue;
                count = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
                for (size_t i = 0; i < count; i++) {
                        int fd;
                        memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
                        if (n < CONN_MAX_RECV_FDS)
                                fds[n++] = fd;
                        else
                                safe_close(fd);
                }
        }
        return n;
}

int conn_recv(Conn *c, uint8_t *buf, size_t cap, size_t *ret_len, int *fds, size_t *ret_n_fds)
{
        union {
                char buf[CMSG_SPACE(sizeof(int) * CONN_MAX_RECV_FDS)];
                struct cmsghdr align;
        } ctrl;
        struct iovec iov = { buf, cap };
        struct msghdr mh = {
                .msg_iov = &iov,
                .msg_iovlen = 1,
                .msg_control = ctrl.buf,
                .msg_controllen = sizeof(ctrl.buf),
        };
        ssize_t n;
        size_t nfds;

        n = recvmsg(c->fd, &mh, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
        if (n < 0) {
                if (errno == EAGAIN || errno == EINTR)
                        return CONN_E_AGAIN;
                return -errno;
        }
        nfds = collect_fds(&mh, fds);
        if (n == 0 && nfds == 0)
                return CONN_E_EOF;
        if (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) {
                for (size_t i = 0; i < nfds; i++)
                        safe_close(fds[i]);
                return CONN_E_TRUNC;
        }
        *ret_len = (size_t)n;
        *ret_n_fds = nfds;
        return 0;
}

/* One sendmsg of a whole record. 0, CONN_E_AGAIN or -errno. */
static int send_record(int sock, const uint8_t *data, size_t len, int fd)
{
        union {
                char buf[CMSG_SPACE(sizeof(int))];
                struct cmsghdr align;
        } ctrl;
        struct iovec iov = { (void *)data, len };
        struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };

        if (fd >= 0) {
                struct cmsghdr *cm;

                memset(&ctrl, 0, sizeof(ctrl));
                mh.msg_control = ctrl.buf;
                mh.msg_controllen = sizeof(ctrl.buf);
                cm = CMSG_FIRSTHDR(&mh);
                cm->cmsg_level = SOL_SOCKET;
                cm->cmsg_type = SCM_RIGHTS;
                cm->cmsg_len = CMSG_LEN(sizeof(int));
                memcpy(CMSG_DATA(cm), &fd, sizeof(int));
        }
        for (;;) {
                if (sendmsg(sock, &mh, MSG_NOSIGNAL | MSG_DONTWAIT) >= 0)
                        return 0;
                if (errno == EINTR)
                        continue;
                if (errno == EAGAIN)
                        return CONN_E_AGAIN;
                return -errno;
        }
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
