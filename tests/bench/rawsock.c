/* The baselines' plumbing: blocking SOCK_SEQPACKET records with SCM_RIGHTS, and an echo server
 * that answers each request with as many bytes as it asks for. This is what a broker round trip
 * costs at the very least: two records through the kernel and two wake-ups. The records go through
 * util/fdpass.c's blocking calls (blocking is the cheapest way to wait on one socket), so the
 * baseline builds its control messages exactly as the broker and the library do. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "bench.h"
#include "fdpass.h"
#include "macro.h"

int rec_send(int sock, const void *buf, size_t len, int fd)
{
        return fdpass_send_wait(sock, buf, len, fd);
}

long rec_recv(int sock, void *buf, size_t cap, int *ret_fd)
{
        int fds[4], truncated;
        size_t n_fds = 0;
        ssize_t n = fdpass_recv_wait(sock, buf, cap, fds, ARRAY_SIZE(fds), &n_fds, &truncated);

        *ret_fd = n_fds ? fds[0] : -1;
        for (size_t i = 1; i < n_fds; i++)
                close(fds[i]);
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
        t0 = monotonic_ns();
        if (rec_send(sock, buf, q, fd_out) < 0 || rec_recv(sock, buf, ECHO_BUF, &fd) <= 0)
                die("the echo server went away");
        if (fd >= 0)
                close(fd);
        return monotonic_ns() - t0;
}
