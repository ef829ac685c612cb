/* Filesystem confinement with Landlock: after start-up the broker may read /proc (peer identity,
 * its own fd count), read its policy file's directory (SIGHUP reload) and remove its socket file;
 * every other open, create, write or exec in the filesystem is refused by the kernel. */
#pragma once

/* Restricts the calling process. socket_path may be NULL (an inherited socket), policy_path too.
 * 0; -EOPNOTSUPP when the kernel has no Landlock (logged as a warning, not fatal for the caller
 * to decide); other -errno on failure (logged). */
int landlock_confine(const char *socket_path, const char *policy_path);
