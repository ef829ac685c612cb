/* systemd's socket activation and readiness notification; see sdnotify.h. The protocols are small
 * and stable (sd_listen_fds(3), sd_notify(3)): a few lines here instead of a dependency. */
#include "sdnotify.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "log.h"

#define LISTEN_FDS_START 3 /* sd_listen_fds(3): passed fds start right after stdin, stdout, stderr */

static long env_number(const char *name)
{
        const char *s = getenv(name);
        char *end;
        long v;

        if (!s || !*s)
                return -1;
        errno = 0;
        v = strtol(s, &end, 10);
        return errno || *end || v < 0 ? -1 : v;
}

int sdnotify_listen_fd(int *ret_fd)
{
        long pid = env_number("LISTEN_PID"), n = env_number("LISTEN_FDS");

        /* Never again: nothing this process starts must take the socket for its own. */
        unsetenv("LISTEN_PID");
        unsetenv("LISTEN_FDS");
        unsetenv("LISTEN_FDNAMES");
        /* LISTEN_PID guards against variables inherited from a parent that was activated itself:
         * they describe that process's fds, not ours. */
        if (pid != (long)getpid() || n <= 0)
                return 0;
        if (n > 1) {
                log_error("systemd passed more than one socket; the broker serves one (one ListenSequentialPacket= "
                          "in its .socket unit)", "listen_fds=%ld", n);
                return -EINVAL;
        }
        *ret_fd = LISTEN_FDS_START;
        return 1;
}

int sdnotify_open(void)
{
        const char *path = getenv("NOTIFY_SOCKET");
        struct sockaddr_un sa = { .sun_family = AF_UNIX };
        size_t len;
        int fd;

        if (!path || !*path)
                return -1;
        len = strlen(path);
        /* Not being able to notify is a warning, not a failure: under Type=notify systemd then
         * times the unit out, which says more than a broker that refuses to start. */
        if ((path[0] != '/' && path[0] != '@') || len >= sizeof(sa.sun_path)) {
                log_warn("NOTIFY_SOCKET is not a socket path: systemd will not hear that the broker is ready",
                         "notify_socket=\"%s\"", path);
                return -1;
        }
        memcpy(sa.sun_path, path, len);
        if (path[0] == '@')
                sa.sun_path[0] = 0; /* the abstract namespace */
        fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        /* The address length is the exact name length: an abstract name is not NUL-terminated,
         * and trailing zeros would name another socket. */
        if (fd < 0 ||
            connect(fd, (struct sockaddr *)&sa, (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len)) < 0) {
                log_warn("cannot reach NOTIFY_SOCKET: systemd will not hear that the broker is ready",
                         "notify_socket=\"%s\" error=\"%s\"", path, strerror(errno));
                if (fd >= 0)
                        close(fd);
                return -1;
        }
        unsetenv("NOTIFY_SOCKET");
        return fd;
}

void sdnotify_send(int fd, const char *message)
{
        /* Never blocks: a receiver that does not read (its queue full) would otherwise hold the
         * broker before it serves, or at SIGTERM, for as long as it likes. Such a notification is
         * dropped: under Type=notify systemd then times the unit out, which says what happened. */
        if (fd < 0 || send(fd, message, strlen(message), MSG_DONTWAIT | MSG_NOSIGNAL) >= 0)
                return;
        if (errno == EAGAIN || errno == EWOULDBLOCK)
                log_warn("NOTIFY_SOCKET is full: the notification to systemd was dropped", "message=\"%s\"",
                         message);
        else
                log_warn("the notification to systemd failed", "message=\"%s\" error=\"%s\"", message,
                         strerror(errno));
}
