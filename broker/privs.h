/* Least privilege: the user and group to become after binding, and dropping everything else. */
#pragma once

#include <stdbool.h>
#include <sys/types.h>

typedef struct Privs {
        bool switch_user;
        uid_t uid;
        gid_t gid;
        gid_t socket_gid; /* (gid_t)-1: leave the socket's group alone */
} Privs;

/* Resolves names or numbers (before the sandbox: this may read /etc/passwd). 0 or -errno, logged. */
int privs_resolve(const char *user, const char *group, const char *socket_group, Privs *ret);

/* Switches user and group if asked (only root can), makes the process non-dumpable (no process of
 * its uid may read its memory or take its fds), sets no_new_privs, and drops every capability:
 * ambient, bounding (where permitted), permitted, effective, inheritable. */
int privs_drop(const Privs *p);
