/* The listening socket: created safely at a path, or adopted from an inherited fd. */
#pragma once

#include <sys/types.h>

/* Creates a SOCK_SEQPACKET socket at path with the given mode (and group, unless gid is
 * (gid_t)-1) and listens on it. Refuses a path that is a symlink, that is not a socket, where
 * something may still be listening (only a refused connection makes a socket stale), or whose
 * directory is owned by someone else than root or owner, the uid the broker runs as once started
 * (and warns about a world-writable one without the sticky bit). Returns the fd or -errno (logged). */
int sockpath_listen(const char *path, mode_t mode, gid_t gid, uid_t owner);

/* Checks that fd is a listening SOCK_SEQPACKET Unix socket and makes it non-blocking and
 * close-on-exec. Returns fd or -errno (logged). */
int sockpath_adopt(int fd);

/* Removes the socket file if it still is a socket. */
void sockpath_unlink(const char *path);
