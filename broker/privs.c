/* Dropping privileges after the socket is bound. What it must never do: leave the broker with
 * root or any capability: --user must name an unprivileged user, and the ambient, bounding and
 * effective capability sets are all emptied. */
#include "privs.h"

#include <errno.h>
#include <grp.h>
#include <linux/capability.h>
#include <pwd.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "log.h"

/* A number is taken as an id without a lookup (containers often have no passwd entry for their
 * uid). (uid_t)-1 is excluded: to setresuid and chown it means "leave unchanged". */
static int parse_id(const char *s, unsigned long *ret)
{
        char *end;

        errno = 0;
        *ret = strtoul(s, &end, 10);
        return errno || end == s || *end || *ret >= (unsigned long)UINT32_MAX ? -EINVAL : 0;
}

static int resolve_group(const char *name, gid_t *ret)
{
        unsigned long id;
        struct group *gr;

        if (parse_id(name, &id) == 0) {
                *ret = (gid_t)id;
                return 0;
        }
        gr = getgrnam(name);
        if (!gr) {
                log_error("unknown group", "group=%s", name);
                return -ESRCH;
        }
        *ret = gr->gr_gid;
        return 0;
}

/* Names are looked up here, before the switch and the sandbox: NSS may read files or talk to
 * services that neither the dropped user nor the seccomp filter would allow later. */
int privs_resolve(const char *user, const char *group, const char *socket_group, Privs *ret)
{
        unsigned long id;
        struct passwd *pw;

        memset(ret, 0, sizeof(*ret));
        ret->socket_gid = (gid_t)-1;
        if (socket_group && resolve_group(socket_group, &ret->socket_gid) < 0)
                return -ESRCH;
        if (!user) {
                if (group) {
                        log_error("--group needs --user", NULL);
                        return -EINVAL;
                }
                return 0;
        }
        ret->switch_user = true;
        if (parse_id(user, &id) == 0) {
                ret->uid = (uid_t)id;
                pw = getpwuid(ret->uid);
                /* A numeric uid without a passwd entry gets the gid of the same number, the usual
                 * container convention, rather than staying in root's group. */
                ret->gid = pw ? pw->pw_gid : (gid_t)id;
        } else {
                pw = getpwnam(user);
                if (!pw) {
                        log_error("unknown user", "user=%s", user);
                        return -ESRCH;
                }
                ret->uid = pw->pw_uid;
                ret->gid = pw->pw_gid;
        }
        if (group && resolve_group(group, &ret->gid) < 0)
                return -ESRCH;
        if (ret->uid == 0) {
                log_error("--user must name an unprivileged user", "user=%s", user);
                return -EINVAL;
        }
        return 0;
}

static int drop_capabilities(void)
{
        struct __user_cap_header_struct hdr = { _LINUX_CAPABILITY_VERSION_3, 0 };
        struct __user_cap_data_struct data[2];

        /* The result is ignored: a kernel without ambient capabilities (before 4.3) refuses the
         * call, and then there is nothing ambient to clear. */
        (void)prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
        /* Shrinking the bounding set needs CAP_SETPCAP; without it there is nothing to shrink
         * that we could use anyway, as no_new_privs forbids gaining capabilities. */
        for (int cap = 0; cap <= 63; cap++)
                if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0 && errno != EINVAL && errno != EPERM)
                        break;
        memset(data, 0, sizeof(data));
        if (syscall(SYS_capset, &hdr, data) < 0) {
                int r = -errno;
                log_error("cannot drop capabilities", "error=\"%s\"", strerror(errno));
                return r;
        }
        return 0;
}

int privs_drop(const Privs *p)
{
        if (p->switch_user) {
                if (geteuid() != 0) {
                        log_error("--user needs the broker to start as root", "euid=%u", (unsigned)geteuid());
                        return -EPERM;
                }
                /* Order matters: supplementary groups and the gid can only be changed while still
                 * root, so they go before the uid; all three ids of each set, so no saved id is
                 * left to switch back to. */
                if (setgroups(0, NULL) < 0 || setresgid(p->gid, p->gid, p->gid) < 0 ||
                    setresuid(p->uid, p->uid, p->uid) < 0) {
                        int r = -errno;
                        log_error("cannot switch user", "uid=%u gid=%u error=\"%s\"", (unsigned)p->uid,
                                  (unsigned)p->gid, strerror(errno));
                        return r;
                }
                /* Make sure there is no way back. */
                if (setuid(0) == 0 || seteuid(0) == 0) {
                        log_error("could regain root after switching user; refusing to run", NULL);
                        return -EPERM;
                }
                log_info("switched user", "uid=%u gid=%u", (unsigned)p->uid, (unsigned)p->gid);
        } else if (geteuid() == 0) {
                log_warn("running as root; pass --user to drop to an unprivileged user", NULL);
        }
        /* The broker holds every peer's memory fds. A dumpable process lets any process of its uid
         * take them (pidfd_getfd, ptrace, /proc/PID/fd); non-dumpable, only a holder of
         * CAP_SYS_PTRACE can. Switching user already cleared the flag, starting as the final uid
         * (as the Kubernetes manifests do) does not: set it in every case. */
        if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) < 0) {
                int r = -errno;
                log_error("cannot make the broker non-dumpable", "error=\"%s\"", strerror(errno));
                return r;
        }
        if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) {
                int r = -errno;
                log_error("cannot set no_new_privs", "error=\"%s\"", strerror(errno));
                return r;
        }
        return drop_capabilities();
}
