/* The broker's memory budget: the bytes a peer can make the broker keep, charged per uid where they
 * are allocated and given back where they are freed, so that the sum stays under the container's
 * memory limit whatever the peers do. Pure accounting: it allocates only its own per-uid entries,
 * and reads no file (budget_derive and budget_parse_* take the texts main.c read).
 *
 * Two pools, each half of the budget and half of every uid's share:
 *   held    what the broker keeps on a peer's behalf: connections, subscriptions, waits, groups,
 *           claims, buffers with their names and metadata, references, rings. What does not fit is
 *           refused (the registry answers quota, naming the budget).
 *   output  frames queued for a peer that has not read them yet. A peer whose queue would take its
 *           uid (or all peers) over the pool is disconnected, as one over --max-queued-bytes is.
 * Separate pools, so that one never starves the other: a uid that holds all it may still gets its
 * replies, and peers that do not read cannot make the broker refuse a subscription. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hmap.h"

typedef enum BudgetPool { BUDGET_HELD, BUDGET_OUTPUT, _BUDGET_POOL_MAX } BudgetPool;

/* Why a charge did not fit. */
enum {
        BUDGET_E_UID = 1, /* the uid's share of the pool */
        BUDGET_E_ALL,     /* the pool itself (all uids together) */
};

typedef struct BudgetUid {
        HNode node;
        uint32_t uid;
        uint64_t used[_BUDGET_POOL_MAX];
} BudgetUid;

typedef struct Budget {
        uint64_t limit;     /* all pools of all uids together */
        uint64_t uid_share; /* all pools of one uid */
        uint64_t used[_BUDGET_POOL_MAX];
        uint64_t peak;      /* of used[] summed */
        uint64_t refused;   /* charges that did not fit (held) or peers over their share (output) */
        uint64_t freed;     /* bytes given back since budget_take_freed last asked */
        uint64_t mismatched; /* uncharges of more than was charged (bugs: clamped, counted) */
        HMap uids;          /* BudgetUid: only uids that have something charged */
} Budget;

/* What a refused charge names (for its error text). */
typedef struct BudgetRefusal {
        unsigned which;   /* BUDGET_E_UID or BUDGET_E_ALL */
        uint64_t used;    /* what the uid (or all uids) has in the pool */
        uint64_t limit;   /* its share (or the pool) */
} BudgetRefusal;

/* A budget of limit bytes, each uid taking at most uid_share of it (clamped to limit). */
void budget_init(Budget *b, uint64_t limit, uint64_t uid_share);

/* Frees the per-uid entries (whatever is still charged). */
void budget_deinit(Budget *b);

/* What the allocator really takes for an allocation of n bytes (glibc: an 8-byte header, rounded
 * up to 16, at least 32), so that many small objects are charged what they cost. */
static inline uint64_t budget_alloc_cost(uint64_t n)
{
        uint64_t c = (n + 8 + 15) & ~(uint64_t)15;
        return c < 32 ? 32 : c;
}

/* Charges n bytes of pool to uid if they fit in its share and in the pool: 0; BUDGET_E_UID or
 * BUDGET_E_ALL (nothing charged; ret, unless NULL, says what was full); -ENOMEM. NULL b: no budget
 * (always 0). */
int budget_charge(Budget *b, uint32_t uid, BudgetPool pool, uint64_t n, BudgetRefusal *ret);

/* Charges n bytes whether they fit or not (memory already taken: a frame queued). 0 or -ENOMEM.
 * budget_over says whether the uid is over its share now. */
int budget_force(Budget *b, uint32_t uid, BudgetPool pool, uint64_t n);

/* Gives n bytes of pool back (they were charged to uid). */
void budget_uncharge(Budget *b, uint32_t uid, BudgetPool pool, uint64_t n);

/* 0 if uid (and all uids) are within pool, else what is over: BUDGET_E_UID or BUDGET_E_ALL (ret,
 * unless NULL, says by how much). */
int budget_over(const Budget *b, uint32_t uid, BudgetPool pool, BudgetRefusal *ret);

/* What uid has charged in pool. */
uint64_t budget_uid_used(const Budget *b, uint32_t uid, BudgetPool pool);

/* Bytes given back since the last call (then 0): the server trims the heap after a burst of frees. */
uint64_t budget_take_freed(Budget *b);

/* ---- the default budget, from the container's limit (main.c reads the files) ---- */

/* The cgroup v2 path of a process from the text of /proc/self/cgroup (its "0::PATH" line) into
 * ret (cap bytes). 0, or -ENOENT (no cgroup v2 line: cgroup v1 or none), -ENAMETOOLONG. */
int budget_parse_cgroup(const char *text, char *ret, size_t cap);

/* The limit a cgroup's memory.max text sets: 0 with *ret the bytes, or with *ret UINT64_MAX for
 * "max" (no limit); -EINVAL for anything else. */
int budget_parse_memory_max(const char *text, uint64_t *ret);

/* The default budget for a container whose memory limit is limit (UINT64_MAX: none) on a machine of
 * phys bytes: half the limit (the other half is the broker's own: its code and libraries, the
 * allocator's slack, what one loop turn encodes at once, the kernel's socket buffers the cgroup
 * also counts); without a limit, a quarter of the machine's memory. */
uint64_t budget_default(uint64_t limit, uint64_t phys);

/* A uid's default share of a budget: a quarter, as with connections (1024 of 4096). */
static inline uint64_t budget_default_share(uint64_t budget)
{
        return budget / 4;
}

/* A byte count as flags give it: digits, optionally followed by K, M or G (powers of 1024). 0 and
 * *ret, or -EINVAL (no digits, another suffix, a sign, overflow). */
int budget_parse_size(const char *s, uint64_t *ret);
