/* Peer identity, read from the kernel once at accept and never from messages. Nothing here
 * knows the registry or the protocol: the registry keeps these credentials, peer.c reads them. */
#pragma once

#include <stdint.h>

/* Identity read from the kernel at accept. */
typedef struct PeerCreds {
        uint32_t uid, gid;
        uint32_t pid;   /* in the broker's PID namespace; 0 = the peer is outside it */
        uint64_t pidns; /* PID-namespace inode read from /proc by the broker; 0 = unknown */
        uint32_t self_pid; /* the PID it has in its own PID namespace (NSpid); 0 = unknown */
} PeerCreds;

/* Fills ret with the socket peer's uid, gid, pid (0 when outside our PID namespace) and PID
 * namespace inode as the kernel tells it (0 when it does not: under the sandbox only a peer in the
 * broker's own namespace is known), and opens a pidfd that becomes readable when
 * that process exits: SO_PEERPIDFD where the kernel has it, else pidfd_open() guarded by a
 * start-time check so that a recycled pid is never mistaken for the peer. *ret_pidfd is -1 when
 * no pidfd could be had (the peer is then watched by EOF alone); the caller owns it.
 * accepted_ticks: CLOCK_BOOTTIME at accept, in clock ticks. 0 or -errno. */
int creds_identify(int sock, uint64_t accepted_ticks, PeerCreds *ret, int *ret_pidfd);

/* CLOCK_BOOTTIME in clock ticks (the unit of /proc/<pid>/stat's start time). */
uint64_t creds_boottime_ticks(void);

/* The PID-namespace inode of a process, 0 if unknown. pid 0 means ourselves. */
uint64_t creds_pidns_of(uint32_t pid);
