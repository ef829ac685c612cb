/* Every limit a peer can run into, in one place: each has a default here and a --max-* flag in
 * main.c, and running into one is answered with the quota status, never with a crash. */
#pragma once

#include <stdint.h>

typedef struct Limits {
        uint32_t connections;          /* all connections together */
        uint32_t connections_per_uid;
        uint32_t buffers_per_uid;      /* registered buffers a uid owns (live, retired or idle) */
        uint32_t fds_per_uid;          /* memory fds the broker holds on a uid's behalf */
        uint32_t refs_per_peer;        /* references one connection holds */
        uint32_t waits_per_peer;       /* attaches and group joins pending at once */
        uint32_t subs_per_peer;        /* subscriptions */
        uint32_t claims_per_uid;       /* pending claims (reclaims waiting for their producer) of a uid's peers */
        uint32_t claims;               /* pending claims of all peers together */
        uint32_t queued_bytes;         /* replies and events queued for a peer that does not read */
        uint32_t queued_fds;           /* fds sent to a peer it has not received: in its socket (charged to the
                                        * broker's uid by the kernel) or queued (each one an fd the broker holds) */
        uint32_t max_timeout_ms;       /* longest wait a peer may ask for (longer is clamped) */
        /* The memory budget (broker/budget.h): bytes of everything peers make the broker keep, and
         * one uid's share of them; --memory-budget and --memory-budget-per-uid, not --max-* flags (main.c
         * derives the default from the container's memory limit). 0: no budget. */
        uint64_t memory_budget;
        uint64_t memory_per_uid;
        /* Bytes of broker-held memory (memfd or cuda-vmm whose fd the broker keeps, which outlives its
         * producer: loaded weights) a uid may have registered; --max-held-memory-per-uid. 0: no limit. */
        uint64_t held_memory_per_uid;
} Limits;

#define LIMITS_DEFAULT                                                  \
        ((Limits){                                                      \
                .connections = 4096,                                    \
                .connections_per_uid = 1024,                            \
                .buffers_per_uid = 65536,                               \
                .fds_per_uid = 65536,                                   \
                .refs_per_peer = 65536,                                 \
                .waits_per_peer = 256,                                  \
                .subs_per_peer = 64,                                    \
                .claims_per_uid = 65536,                                \
                .claims = 262144,                                       \
                .queued_bytes = 4u << 20,                               \
                .queued_fds = 32,                                       \
                .max_timeout_ms = 24u * 3600u * 1000u,                  \
        })
