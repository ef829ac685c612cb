/* The baselines' plumbing: blocking SOCK_SEQPACKET records with SCM_RIGHTS, and an echo server
 * that answers each request with as many bytes as it asks for. This is what a broker round trip
 * costs at the very least: two records through the kernel and two wake-ups. Written apart from
 * util/fdpass.c on purpose: the baseline blocks (the cheapest way to wait) and must not share
 * code with what it is compared against. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "bench.h"
#include "macro.h"

int rec_send(int sock, const void *buf, size_t len, int fd)
{
        union {
                char buf[CMSG_SPACE(sizeof(int))];
                struct cmsghdr align;
        } ctrl;
        struct iovec iov = {(void *)buf, len};
        struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};

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
        while (sendmsg(sock, &mh, MSG_NOSIGNAL) < 0) {
                if (errno != EINTR)
                        return -errno;
        }
        return 0;
}

long rec_recv(int sock, void *buf, size_t cap, int *ret_fd)
{
        union {
                char buf[CMSG_SPACE(sizeof(int) * 4)];
                struct cmsghdr align;
        } ctrl;
        struct iovec iov = {buf, cap};
        struct msghdr mh = {.msg_iov = &iov,
                            .msg_iovlen = 1,
                            .msg_control = ctrl.buf,
                            .msg_controllen = sizeof(ctrl.buf)};
        ssize_t n;

        *ret_fd = -1;
        while ((n = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC)) < 0) {
                if (errno != EINTR)
                        return -errno;
        }
        for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
                if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
                        continue;
                for (size_t i = 0; i < (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int); i++) {
                        int fd;
                        memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
                        if (*ret_fd < 0)
                                *ret_fd = fd;
                        else
                                close(fd);
                }
        }
        return (long)n;
}

int echo_serve(int sock)
{
        uint8_t *buf = malloc(ECHO_BUF);
        int memfd = sealed_memfd(4096);

        if (!buf)
                return 1;
        for (;;) {
                EchoHdr h = {0};
                int fd;
                long n = rec_recv(sock, buf, ECHO_BUF, &fd);

                if (fd >= 0)
                        close(fd);
                if (n <= 0)
                        return n == 0 ? 0 : 1;
                memcpy(&h, buf, MIN((size_t)n, sizeof(h)));
                if (h.reply_len > ECHO_BUF)
                        h.reply_len = ECHO_BUF;
                if (rec_send(sock, buf, h.reply_len, h.fd_back ? memfd : -1) < 0)
                        return 1;
        }
}

uint64_t echo_round(int sock, uint8_t *buf, size_t q, size_t r, int fd_out, bool fd_back)
{
        EchoHdr h = {(uint32_t)r, fd_back};
        uint64_t t0;
        int fd;

        memcpy(buf, &h, sizeof(h));
        t0 = now_ns();
        if (rec_send(sock, buf, q, fd_out) < 0 || rec_recv(sock, buf, ECHO_BUF, &fd) <= 0)
                die("the echo server went away");
        if (fd >= 0)
                close(fd);
        return now_ns() - t0;
}
