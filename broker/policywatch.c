/* The policy file's directory under inotify (see policywatch.h). It never reloads anything
 * itself: it only says the file may have changed, and the server reloads as on SIGHUP. */
#include "policywatch.h"

#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <unistd.h>

#include "log.h"
#include "macro.h"

/* The name the kubelet's atomic writer swaps: `..data` -> `..<timestamp>/`, with every key of the
 * ConfigMap a symlink `key -> ..data/key` that itself never changes. */
#define CONFIGMAP_DATA "..data"

/* A file finished being written in place; a name renamed into place (an editor's new file, the
 * kubelet's symlink swap); the directory itself removed or moved away. IN_MODIFY and IN_CREATE are
 * left out on purpose: they come before the writer is done, and half a policy must never load. */
#define WATCHED (IN_CLOSE_WRITE | IN_MOVED_TO | IN_DELETE_SELF | IN_MOVE_SELF)

struct PolicyWatch {
        int fd;
        char name[NAME_MAX + 1]; /* the policy file's name in the directory */
};

int policy_watch_new(PolicyWatch **ret, const char *policy_path)
{
        char dir_buf[PATH_MAX], name_buf[PATH_MAX];
        PolicyWatch *w;
        const char *dir, *name;
        int r;

        /* Two copies: dirname and basename may each modify the string they are given. */
        if (snprintf(dir_buf, sizeof(dir_buf), "%s", policy_path) >= (int)sizeof(dir_buf) ||
            snprintf(name_buf, sizeof(name_buf), "%s", policy_path) >= (int)sizeof(name_buf))
                return -ENAMETOOLONG;
        dir = dirname(dir_buf);
        name = basename(name_buf);
        if (strlen(name) > NAME_MAX)
                return -ENAMETOOLONG;
        w = calloc(1, sizeof(*w));
        if (!w)
                return -ENOMEM;
        snprintf(w->name, sizeof(w->name), "%s", name);
        w->fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
        if (w->fd < 0) {
                r = -errno;
                log_error("cannot watch the policy file: inotify", "error=\"%s\"", strerror(errno));
                free(w);
                return r;
        }
        /* The directory, not the file: a file replaced by a rename (an editor, the kubelet) is a
         * new inode, and a watch on the old one would never fire again. */
        if (inotify_add_watch(w->fd, dir, WATCHED | IN_ONLYDIR) < 0) {
                r = -errno;
                log_error("cannot watch the policy file's directory", "dir=%s error=\"%s\"", dir, strerror(errno));
                policy_watch_free(w);
                return r;
        }
        log_debug("watching the policy file", "dir=%s file=%s", dir, w->name);
        *ret = w;
        return 0;
}

PolicyWatch *policy_watch_free(PolicyWatch *w)
{
        if (!w)
                return NULL;
        safe_close(w->fd);
        free(w);
        return NULL;
}

int policy_watch_fd(const PolicyWatch *w)
{
        return w->fd;
}

static bool names_policy(const PolicyWatch *w, const struct inotify_event *e)
{
        return e->len > 0 && (strcmp(e->name, w->name) == 0 || strcmp(e->name, CONFIGMAP_DATA) == 0);
}

int policy_watch_read(PolicyWatch *w, bool *ret_lost)
{
        /* Aligned for struct inotify_event; several events fit, and a short buffer only means
         * another read. */
        char buf[4096] __attribute__((aligned(__alignof__(struct inotify_event))));
        bool changed = false;

        *ret_lost = false;
        for (;;) {
                ssize_t n = read(w->fd, buf, sizeof(buf));

                if (n < 0) {
                        if (errno == EINTR)
                                continue;
                        if (errno == EAGAIN)
                                break;
                        return -errno;
                }
                if (n == 0)
                        break;
                for (char *p = buf; p < buf + n;) {
                        const struct inotify_event *e = (const struct inotify_event *)p;

                        if (e->mask & (IN_DELETE_SELF | IN_MOVE_SELF | IN_IGNORED))
                                *ret_lost = true;
                        else if (e->mask & IN_Q_OVERFLOW)
                                changed = true; /* events were dropped: look again to be sure */
                        else if (names_policy(w, e))
                                changed = true;
                        p += sizeof(*e) + e->len;
                }
        }
        if (*ret_lost)
                log_warn("the policy file's directory is gone; the policy is no longer reloaded on change "
                         "(SIGHUP still reloads it)",
                         NULL);
        return changed;
}
