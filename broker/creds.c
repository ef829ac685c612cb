/* Peer identity at accept: SO_PEERCRED, a pidfd (SO_PEERPIDFD or pidfd_open + start time), and
 * the PID namespace where the kernel tells it. See docs/design.md "Identity and diagnosis".
 *
 * What it must never do: take identity from what a peer says. A namespace the kernel does not
 * show (the peer is outside the broker's PID namespace, or /proc is closed to the sandbox) is left
 * unknown here; the registry then uses the hello's claim, marked as declared. */
#include "creds.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "macro.h"

#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77 /* Linux 6.5; Debian 12's headers predate it */
#endif

/* CLOCK_BOOTTIME, not MONOTONIC: /proc/<pid>/stat's start time counts from boot including time
 * suspended, and the two must be on one clock to be compared. */
uint64_t creds_boottime_ticks(void)
{
        long hz = sysconf(_SC_CLK_TCK);

        return clock_ns(CLOCK_BOOTTIME) / (1000000000ull / (uint64_t)hz);
}

uint64_t creds_pidns_of(uint32_t pid)
{
        char path[64];
        struct stat st;

        if (pid)
                snprintf(path, sizeof(path), "/proc/%u/ns/pid", pid);
        else
                snprintf(path, sizeof(path), "/proc/self/ns/pid");
        return stat(path, &st) == 0 ? (uint64_t)st.st_ino : 0;
}

/* What NSpid in /proc/<pid>/status says: how many PID namespaces a process is in, counted from the
 * one /proc belongs to, and its PID in the innermost, its own (the PID it sees for itself).
 * 0 on success, -EIO if unknown. Unlike /proc/<pid>/ns/pid, which Landlock and the ptrace rules
 * keep from the broker for every process but itself, status is readable for all. */
static int nspid_of(const char *status_path, unsigned *ret_depth, uint32_t *ret_own_pid)
{
        char buf[4096], *line, *end;
        _cleanup_close_ int fd = open(status_path, O_RDONLY | O_CLOEXEC);
        unsigned depth = 0;
        unsigned long v = 0;
        ssize_t n;

        /* One read of 4 KiB: NSpid comes within the first few hundred bytes of status. */
        if (fd < 0 || (n = read(fd, buf, sizeof(buf) - 1)) <= 0)
                return -EIO;
        buf[n] = 0;
        line = strstr(buf, "\nNSpid:");
        if (!line)
                return -EIO;
        for (char *p = line + 7; *p && *p != '\n'; p = end) {
                errno = 0;
                v = strtoul(p, &end, 10);
                if (end == p || errno || v == 0 || v > UINT32_MAX)
                        return -EIO;
                depth++;
        }
        if (!depth)
                return -EIO;
        *ret_depth = depth;
        *ret_own_pid = (uint32_t)v;
        return 0;
}

/* The PID namespace of a peer the kernel shows in ours (pid > 0), read where the sandbox lets us:
 * the namespace link works only while the broker is not confined (and may inspect the peer); a
 * peer at the same NSpid depth as the broker is in the broker's own namespace (a visible pid is in
 * ours or one below it). 0 when neither tells: the peer's declared namespace is all there is.
 * depth: the peer's NSpid depth (0 = unknown). */
static uint64_t pidns_from_kernel(uint32_t pid, unsigned depth, int pidfd)
{
        /* The broker's own depth and namespace never change: read once, at the first peer that
         * needs them. */
        static unsigned self_depth;
        static uint64_t self_ns;
        uint64_t ns = creds_pidns_of(pid);
        uint32_t self_pid;

        if (ns)
                return ns;
        if (!self_depth) {
                if (nspid_of("/proc/self/status", &self_depth, &self_pid) < 0)
                        self_depth = 0;
                self_ns = creds_pidns_of(0);
        }
        if (pidfd < 0 || !self_depth || !self_ns || depth != self_depth)
                return 0;
        return self_ns;
}

/* What the kernel shows of a peer visible in our PID namespace (pid > 0): its namespace and the PID
 * it has there (NSpid's last entry: legacy CUDA IPC compares these, docs/design.md "Identity and
 * diagnosis"). Whatever /proc could not tell stays 0. The pidfd guards against the pid having been
 * recycled while /proc was read: nothing is believed of a peer that exited meanwhile. */
static void ns_from_kernel(uint32_t pid, int pidfd, PeerCreds *c)
{
        struct pollfd exited = { .fd = pidfd, .events = POLLIN };
        unsigned depth = 0;
        uint32_t own = 0;
        char path[64];

        snprintf(path, sizeof(path), "/proc/%u/status", pid);
        if (nspid_of(path, &depth, &own) < 0)
                depth = own = 0;
        c->pidns = pidns_from_kernel(pid, depth, pidfd);
        c->self_pid = pidfd >= 0 ? own : 0;
        if (pidfd >= 0 && poll(&exited, 1, 0) != 0)
                c->pidns = c->self_pid = 0;
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
        /* The last ')': a command name may itself contain ") ", which would throw a forward
         * scan off by fields. */
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

int creds_identify(int sock, uint64_t accepted_ticks, PeerCreds *ret, int *ret_pidfd)
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
        };
        if (cred.pid > 0)
                ns_from_kernel((uint32_t)cred.pid, pidfd, ret);
        *ret_pidfd = pidfd;
        return 0;
}
