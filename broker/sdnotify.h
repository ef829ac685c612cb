/* systemd's two service protocols, without libsystemd: socket activation (the listening socket
 * passed as fd 3, LISTEN_FDS) and the readiness notification (NOTIFY_SOCKET). */
#pragma once

/* The socket systemd passed (fd 3), checked to be meant for this process (LISTEN_PID); the
 * variables are cleared either way. 0 when none was passed, 1 with *ret_fd set, or -EINVAL when
 * more than one was (logged: the broker serves one socket). */
int sdnotify_listen_fd(int *ret_fd);

/* A datagram socket connected to $NOTIFY_SOCKET (a path, or "@name" in the abstract namespace), or
 * -1 when it is not set or cannot be reached (logged). Open it before the seccomp filter is loaded:
 * sending on it afterwards is a sendto(2), which the runtime allow-list has. */
int sdnotify_open(void);

/* Sends one notification ("READY=1", "STOPPING=1", ...) on fd; nothing for fd < 0. Never blocks: a
 * full socket drops it (logged). */
void sdnotify_send(int fd, const char *message);
