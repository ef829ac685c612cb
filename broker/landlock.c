/* Landlock rules for the broker (see landlock.h). Seccomp cannot tell paths apart; Landlock can,
 * so the two together give "no network, no exec, no files but these". A kernel without Landlock
 * (EOPNOTSUPP) must not stop the broker: seccomp still confines it, and the log says so. */
#include "landlock.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <linux/landlock.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "log.h"
#include "macro.h"

#define FS_V1 ((1ULL << 13) - 1)  /* EXECUTE .. MAKE_SYM */
#define FS_REFER (1ULL << 13)     /* ABI 2 */
#define FS_TRUNCATE (1ULL << 14)  /* ABI 3 */
#define FS_IOCTL_DEV (1ULL << 15) /* ABI 5 */

/* The rights this kernel knows, all of them handled (so denied unless a rule grants them): a bit
 * the kernel does not know makes the whole ruleset EINVAL, and a right left unhandled would be
 * allowed everywhere. ABI 4 added only network rights, which seccomp covers for the broker. */
static uint64_t handled_for_abi(long abi)
{
        uint64_t fs = FS_V1;

        if (abi >= 2)
                fs |= FS_REFER;
        if (abi >= 3)
                fs |= FS_TRUNCATE;
        if (abi >= 5)
                fs |= FS_IOCTL_DEV;
        return fs;
}

static int allow_beneath(int ruleset, const char *path, uint64_t access)
{
        struct landlock_path_beneath_attr pb = { .allowed_access = access };
        /* O_PATH: the rule needs a handle on the directory, not the right to read it. */
        _cleanup_close_ int fd = open(path, O_PATH | O_CLOEXEC);

        if (fd < 0) {
                int r = -errno;
                log_error("landlock: cannot open a path to allow", "path=%s error=\"%s\"", path, strerror(errno));
                return r;
        }
        pb.parent_fd = fd;
        if (syscall(SYS_landlock_add_rule, ruleset, LANDLOCK_RULE_PATH_BENEATH, &pb, 0) < 0) {
                int r = -errno;
                log_error("landlock: cannot add a rule", "path=%s error=\"%s\"", path, strerror(errno));
                return r;
        }
        return 0;
}

/* The directory holding path (for a file that is replaced rather than rewritten, such as a
 * ConfigMap's symlinked file, the directory is what stays). */
static void parent_of(const char *path, char *buf, size_t cap)
{
        char copy[4096];

        snprintf(copy, sizeof(copy), "%s", path);
        snprintf(buf, cap, "%s", dirname(copy));
}

int landlock_confine(const char *socket_path, const char *policy_path)
{
        const uint64_t read = LANDLOCK_ACCESS_FS_READ_FILE | LANDLOCK_ACCESS_FS_READ_DIR;
        struct landlock_ruleset_attr attr = { 0 };
        _cleanup_close_ int ruleset = -1;
        char dir[4096];
        long abi;
        int r;

        abi = syscall(SYS_landlock_create_ruleset, NULL, 0, LANDLOCK_CREATE_RULESET_VERSION);
        if (abi < 0) {
                log_warn("landlock is not available; file access is confined by seccomp alone", "error=\"%s\"",
                         strerror(errno));
                return -EOPNOTSUPP;
        }
        attr.handled_access_fs = handled_for_abi(abi);
        ruleset = (int)syscall(SYS_landlock_create_ruleset, &attr, sizeof(attr), 0);
        if (ruleset < 0) {
                r = -errno;
                log_error("landlock: cannot create a ruleset", "error=\"%s\"", strerror(errno));
                return r;
        }
        /* /proc: the broker reads its peers' credentials and namespaces there, and counts its own
         * fds (stats), for as long as it runs. */
        r = allow_beneath(ruleset, "/proc", read);
        if (r < 0)
                return r;
        if (socket_path) {
                parent_of(socket_path, dir, sizeof(dir));
                /* Removing only: the socket is unlinked at exit; it was made before confinement,
                 * and nothing else in its directory may be touched. */
                r = allow_beneath(ruleset, dir, LANDLOCK_ACCESS_FS_REMOVE_FILE);
                if (r < 0)
                        return r;
        }
        if (policy_path) {
                parent_of(policy_path, dir, sizeof(dir));
                r = allow_beneath(ruleset, dir, read);
                if (r < 0)
                        return r;
        }
        /* From here on for the rest of the process's life: Landlock cannot be undone, only
         * tightened. */
        if (syscall(SYS_landlock_restrict_self, ruleset, 0) < 0) {
                r = -errno;
                log_error("landlock: cannot restrict the broker", "error=\"%s\"", strerror(errno));
                return r;
        }
        log_debug("landlock rules applied", "abi=%ld", abi);
        return 0;
}
