/* One SOCK_SEQPACKET record with its SCM_RIGHTS fds, sent or received without blocking. The
 * broker and the client library share this, so fd hygiene lives in one place: received fds are
 * CLOEXEC, surplus fds are closed, truncation is reported. */
#pragma once

#include <stddef.h>
#include <sys/types.h>

#define FDPASS_MAX_FDS 16 /* the most fds fdpass_recv() can hand back from one record */

/* Sends len bytes with fd attached (-1: none), MSG_DONTWAIT | MSG_NOSIGNAL, retrying on EINTR.
 * fd is borrowed. Returns 0 or -errno (-EAGAIN when the socket is full). */
int fdpass_send(int sock, const void *buf, size_t len, int fd);

/* Receives one record (MSG_DONTWAIT | MSG_CMSG_CLOEXEC, retrying on EINTR). Up to max_fds
 * (<= FDPASS_MAX_FDS) fds go into fds and *ret_n_fds; more are closed, and then, like a record
 * larger than cap or a truncated control message, *ret_truncated is set. Returns the record's
 * length (0 at EOF) or -errno. The caller owns the returned fds. */
ssize_t fdpass_recv(int sock, void *buf, size_t cap, int *fds, size_t max_fds, size_t *ret_n_fds, int *ret_truncated);

/* The same, blocking until the record could be sent or one arrived: for programs that wait on one
 * socket alone (the benchmark's baselines), where blocking is the cheapest way to wait. */
int fdpass_send_wait(int sock, const void *buf, size_t len, int fd);
ssize_t fdpass_recv_wait(int sock, void *buf, size_t cap, int *fds, size_t max_fds, size_t *ret_n_fds,
                         int *ret_truncated);
