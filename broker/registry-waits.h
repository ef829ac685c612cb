/* registry-waits.c: attach waits, groups and their deadlines. */
#pragma once

#include "registry-core.h"

typedef struct RegGroup {
        HNode node;
        Timer timer;
        uint32_t members, joined;
        List joins; /* Wait.link */
        char name[];
} RegGroup;

/* An attach waiting for a name, or a member waiting for its group to fill. */
typedef struct Wait {
        Timer timer; /* attach waits only: groups keep one timer for all members */
        RegPeer *peer;
        uint64_t req_id, deadline;
        uint64_t name_publishes; /* attach waits: the name's publishes when the wait began */
        RegName *name;
        RegGroup *group;
        List peer_link, link;
        uint32_t cost; /* charged to its peer's uid (held budget): reg_wait_cost */
} Wait;

/* What a wait costs: itself, and its name's or group's entry as if it were the only one waiting
 * there (an entry lives while anyone waits), their index and timer slots, and its reply. */
static inline uint64_t reg_wait_cost(size_t entry, size_t name_len)
{
        return budget_alloc_cost(sizeof(Wait)) + budget_alloc_cost(entry + name_len + 1) + 2 * REG_INDEX_COST +
               REG_FRAME_COST;
}

void reg_wait_free(Registry *r, Wait *w);

void reg_join_free(Registry *r, Wait *w);

void reg_group_free(Registry *r, RegGroup *g);

/* Re-arms the group's timer at the earliest deadline among its members. */
int reg_group_rearm(Registry *r, RegGroup *g);

/* A buffer was just published under e: hands it to everyone waiting for the name, oldest first, for
 * as long as it stays published (retire_after may retire it half-way). */
void reg_waiters_wake(Registry *r, RegName *e, RegSink *o);
