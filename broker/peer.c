/* Peer identity at accept: SO_PEERCRED, a pidfd (SO_PEERPIDFD or pidfd_open + start time), and
 * the PID namespace from /proc. See DESIGN.md "Identity and security". */
#include "peer.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "macro.h"

#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77 /* Linux 6.5; Debian 12's headers predate it */
#endif

uint64_t peer_boottime_ticks(void)
{
        struct timespec ts;
        long hz = sysconf(_SC_CLK_TCK);

        clock_gettime(CLOCK_BOOTTIME, &ts);
        return (uint64_t)ts.tv_sec * (uint64_t)hz + (uint64_t)ts.tv_nsec / (1000000000ull / (uint64_t)hz);
}

uint64_t peer_pidns_of(uint32_t pid)
{
        char path[64];
        struct stat st;

        if (pid)
                snprintf(path, sizeof(path), "/proc/%u/ns/pid", pid);
        else
                snprintf(path, sizeof(path), "/proc/self/ns/pid");
        return stat(path, &st) == 0 ? (uint64_t)st.st_ino : 0;
}

/* Field 22 of /proc/<pid>/stat, after the parenthesised command name (which may hold spaces). */
static int start_ticks_of(uint32_t pid, uint64_t *ret)
{
        char path[64], buf[1024];
        _cleanup_close_ int fd = -1;
        unsigned long long start;
        const char *p;
        ssize_t n;

        snprintf(path, sizeof(path), "/proc/%u/stat", pid);
        fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                return -errno;
        n = read(fd, buf, sizeof(buf) - 1);
        if (n <= 0)
                return -EIO;
        buf[n] = 0;
        p = strrchr(buf, ')');
        if (!p)
                return -EIO;
        /* after ")": state(3) ... starttime(22): skip 19 fields */
        for (int field = 3; field < 22 && p; field++)
                p = strchr(p + 1, ' ');
        if (!p || sscanf(p + 1, "%llu", &start) != 1)
                return -EIO;
        *ret = start;
        return 0;
}

static int pidfd_fallback(uint32_t pid, uint64_t accepted_ticks)
{
        _cleanup_close_ int fd = -1;
        uint64_t start;

        fd = (int)syscall(SYS_pidfd_open, (pid_t)pid, 0);
        if (fd < 0)
                return -errno;
        /* A process started after we accepted cannot be the one that connected: the pid was
         * recycled between SO_PEERCRED and pidfd_open. */
        if (start_ticks_of(pid, &start) < 0 || start > accepted_ticks)
                return -ESRCH;
        return steal_fd(fd);
}

int peer_identify(int sock, uint64_t accepted_ticks, PeerCreds *ret, int *ret_pidfd)
{
        struct ucred cred;
        socklen_t len = sizeof(cred);
        int pidfd = -1;

        if (getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0)
                return -errno;
        len = sizeof(pidfd);
        if (getsockopt(sock, SOL_SOCKET, SO_PEERPIDFD, &pidfd, &len) < 0) {
                pidfd = -1;
                if (cred.pid > 0)
                        pidfd = pidfd_fallback((uint32_t)cred.pid, accepted_ticks);
                if (pidfd < 0)
                        pidfd = -1;
        }
        *ret = (PeerCreds){
                .uid = cred.uid,
                .gid = cred.gid,
                .pid = cred.pid > 0 ? (uint32_t)cred.pid : 0,
                .pidns = cred.pid > 0 ? peer_pidns_of((uint32_t)cred.pid) : 0,
        };
        *ret_pidfd = pidfd;
        return 0;
}
