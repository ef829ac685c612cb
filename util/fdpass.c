/* SCM_RIGHTS records; see fdpass.h. */
#include "fdpass.h"

#include <errno.h>
#include <stdbool.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* One sendmsg: the record and at most one fd travel together, so the receiver gets the fd with
 * the very frame that announces it (a SEQPACKET record is never split or merged). */
static int send_record(int sock, const void *buf, size_t len, int fd, int flags)
{
        /* The union aligns the control buffer for struct cmsghdr, which CMSG_FIRSTHDR assumes. */
        union {
                char buf[CMSG_SPACE(sizeof(int))];
                struct cmsghdr align;
        } ctrl;
        struct iovec iov = { (void *)buf, len };
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
                /* MSG_NOSIGNAL: a peer that went away is -EPIPE, not a SIGPIPE that kills the
                 * broker or the application using the library. */
                if (sendmsg(sock, &mh, MSG_NOSIGNAL | flags) >= 0)
                        return 0;
                if (errno != EINTR)
                        return -errno;
        }
}

static ssize_t recv_record(int sock, void *buf, size_t cap, int *fds, size_t max_fds, size_t *ret_n_fds,
                           int *ret_truncated, int flags)
{
        union {
                char buf[CMSG_SPACE(sizeof(int) * FDPASS_MAX_FDS)];
                struct cmsghdr align;
        } ctrl;
        struct iovec iov = { buf, cap };
        struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctrl.buf,
                             .msg_controllen = sizeof(ctrl.buf) };
        size_t n_fds = 0;
        bool surplus = false;
        ssize_t n;

        /* MSG_CMSG_CLOEXEC: received fds are close-on-exec from the start, so a fork+exec in another
         * thread cannot leak them into a child. */
        do
                n = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC | flags);
        while (n < 0 && errno == EINTR);
        if (n < 0)
                return -errno;
        /* Anything but SCM_RIGHTS in the control data is ignored: we never ask for credentials. */
        for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
                if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
                        continue;
                for (size_t i = 0; i < (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int); i++) {
                        int fd;

                        memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
                        if (n_fds < max_fds && n_fds < FDPASS_MAX_FDS) {
                                fds[n_fds++] = fd;
                        } else {
                                /* More than the caller takes: closed here, or each such frame
                                 * would leak fds toward the process's limit. */
                                close(fd);
                                surplus = true;
                        }
                }
        }
        *ret_n_fds = n_fds;
        /* Truncated data or fds make the frame unreadable as sent: the caller treats it as a
         * protocol violation rather than decoding part of it. */
        *ret_truncated = surplus || (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC));
        return n;
}

/* The non-blocking pair is for event loops (the broker, the library's pumps); the _wait pair for
 * a caller that owns the socket and may block on it (the benchmark's raw-socket baseline). */
int fdpass_send(int sock, const void *buf, size_t len, int fd)
{
        return send_record(sock, buf, len, fd, MSG_DONTWAIT);
}

ssize_t fdpass_recv(int sock, void *buf, size_t cap, int *fds, size_t max_fds, size_t *ret_n_fds, int *ret_truncated)
{
        return recv_record(sock, buf, cap, fds, max_fds, ret_n_fds, ret_truncated, MSG_DONTWAIT);
}

int fdpass_send_wait(int sock, const void *buf, size_t len, int fd)
{
        return send_record(sock, buf, len, fd, 0);
}

ssize_t fdpass_recv_wait(int sock, void *buf, size_t cap, int *fds, size_t max_fds, size_t *ret_n_fds,
                         int *ret_truncated)
{
        return recv_record(sock, buf, cap, fds, max_fds, ret_n_fds, ret_truncated, 0);
}
