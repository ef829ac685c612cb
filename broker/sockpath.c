/* Creating the broker's socket file without falling for symlinks, stale sockets or directories
 * that someone else controls. What it must never do: remove or replace anything at the path that
 * it has not proved to be a dead socket (a refused connection proves it; nothing else does). */
#include "sockpath.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "log.h"
#include "macro.h"

/* A path, never the abstract namespace (a leading NUL): only a file carries the mode, group and
 * directory checks that decide who may connect. The length leaves room for the terminating NUL. */
static int fill_addr(const char *path, struct sockaddr_un *sa)
{
        size_t len = strlen(path);

        memset(sa, 0, sizeof(*sa));
        sa->sun_family = AF_UNIX;
        if (len == 0 || len >= sizeof(sa->sun_path)) {
                log_error("socket path is empty or too long", "path=%s max_bytes=%zu", path, sizeof(sa->sun_path) - 1);
                return -ENAMETOOLONG;
        }
        memcpy(sa->sun_path, path, len);
        return 0;
}

static int check_directory(const char *path, uid_t owner)
{
        char copy[sizeof(((struct sockaddr_un *)0)->sun_path)];
        struct stat st;
        const char *dir;

        /* dirname may modify its argument: a copy, which fill_addr already bounded. */
        strncpy(copy, path, sizeof(copy) - 1);
        copy[sizeof(copy) - 1] = 0;
        dir = dirname(copy);
        if (stat(dir, &st) < 0) {
                int r = -errno;
                log_error("the socket's directory does not exist", "dir=%s error=\"%s\"", dir, strerror(errno));
                return r;
        }
        if (!S_ISDIR(st.st_mode)) {
                log_error("the socket's parent is not a directory", "dir=%s", dir);
                return -ENOTDIR;
        }
        /* Whoever owns the directory can swap the socket for their own; only root and the user the
         * broker runs as may (with --user that is the account it switches to, not root). */
        if (st.st_uid != 0 && st.st_uid != owner) {
                log_error("refusing a socket directory owned by another user", "dir=%s owner_uid=%u broker_uid=%u",
                          dir, (unsigned)st.st_uid, (unsigned)owner);
                return -EPERM;
        }
        /* Kubernetes creates emptyDir volumes 0777 without the sticky bit; there only the pod's
         * own containers see the directory, so this is worth a warning, not a refusal. */
        if ((st.st_mode & S_IWOTH) && !(st.st_mode & S_ISVTX))
                log_warn("the socket directory is world-writable without the sticky bit: anyone who can reach it "
                         "can replace the socket", "dir=%s", dir);
        return 0;
}

/* Deals with whatever already sits at path: a stale socket is removed, anything else refused.
 * Only a refused connection proves a socket stale: EACCES (the socket of a broker we may not
 * reach), EPROTOTYPE (a live listener of another socket type) or EAGAIN (a live broker with a full
 * backlog) say that something is alive there, and it is not ours to remove. */
static int clear_stale(const char *path, const struct sockaddr_un *sa)
{
        _cleanup_close_ int probe = -1;
        struct stat st;

        if (lstat(path, &st) < 0)
                return errno == ENOENT ? 0 : -errno;
        if (S_ISLNK(st.st_mode)) {
                log_error("refusing a socket path that is a symlink", "path=%s", path);
                return -ELOOP;
        }
        if (!S_ISSOCK(st.st_mode)) {
                log_error("refusing to replace a file that is not a socket", "path=%s", path);
                return -EEXIST;
        }
        /* Non-blocking: a live broker with a full backlog answers EAGAIN instead of stalling us. */
        probe = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (probe < 0)
                return -errno;
        if (connect(probe, (const struct sockaddr *)sa, sizeof(*sa)) == 0) {
                log_error("another broker is listening on this socket", "path=%s", path);
                return -EADDRINUSE;
        }
        switch (errno) {
        case ECONNREFUSED:
                break;
        case ENOENT:
                return 0; /* removed meanwhile */
        case EPROTOTYPE:
                log_error("something listens on this socket with another socket type; refusing to remove it",
                          "path=%s", path);
                return -EADDRINUSE;
        default:
                log_error("cannot tell whether something listens on this socket; refusing to remove it",
                          "path=%s error=\"%s\"", path, strerror(errno));
                return -EADDRINUSE;
        }
        if (unlink(path) < 0 && errno != ENOENT)
                return -errno;
        log_info("removed a stale socket", "path=%s", path);
        return 0;
}

int sockpath_listen(const char *path, mode_t mode, gid_t gid, uid_t owner)
{
        _cleanup_close_ int fd = -1;
        struct sockaddr_un sa;
        mode_t old_umask;
        int r;

        r = fill_addr(path, &sa);
        if (r < 0)
                return r;
        r = check_directory(path, owner);
        if (r < 0)
                return r;
        r = clear_stale(path, &sa);
        if (r < 0)
                return r;
        fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0)
                return -errno;
        /* The umask makes bind create the file with the final mode: no window where it is wider. */
        old_umask = umask(~mode & 0777);
        r = bind(fd, (const struct sockaddr *)&sa, sizeof(sa));
        umask(old_umask);
        if (r < 0) {
                r = -errno;
                log_error("cannot bind the socket", "path=%s error=\"%s\"", path, strerror(errno));
                return r;
        }
        /* Every failure from here unlinks the file bind made: a broker that did not start must not
         * leave a socket that looks stale to the next one and alive to clients' stat. */
        if (gid != (gid_t)-1 && chown(path, (uid_t)-1, gid) < 0) {
                r = -errno;
                log_error("cannot set the socket's group", "path=%s gid=%u error=\"%s\"", path, (unsigned)gid,
                          strerror(errno));
                unlink(path);
                return r;
        }
        if (chmod(path, mode) < 0 || listen(fd, SOMAXCONN) < 0) {
                r = -errno;
                log_error("cannot listen on the socket", "path=%s error=\"%s\"", path, strerror(errno));
                unlink(path);
                return r;
        }
        return steal_fd(fd);
}

int sockpath_adopt(int fd)
{
        int type = 0, listening = 0, flags;
        socklen_t len = sizeof(type);
        struct sockaddr_un sa;
        socklen_t salen = sizeof(sa);

        if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) < 0 ||
            getsockname(fd, (struct sockaddr *)&sa, &salen) < 0 ||
            sa.sun_family != AF_UNIX || type != SOCK_SEQPACKET) {
                log_error("the inherited fd is not a SOCK_SEQPACKET Unix socket", "fd=%d", fd);
                return -ENOTSOCK;
        }
        len = sizeof(listening);
        if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) < 0 || !listening) {
                log_error("the inherited socket is not listening", "fd=%d", fd);
                return -EINVAL;
        }
        flags = fcntl(fd, F_GETFL);
        if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0 || fcntl(fd, F_SETFD, FD_CLOEXEC) < 0)
                return -errno;
        return fd;
}

void sockpath_unlink(const char *path)
{
        struct stat st;

        if (lstat(path, &st) == 0 && S_ISSOCK(st.st_mode))
                unlink(path);
}
