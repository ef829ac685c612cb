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
} Wait;

void reg_wait_free(Registry *r, Wait *w);

void reg_join_free(Registry *r, Wait *w);

void reg_group_free(Registry *r, RegGroup *g);

/* Re-arms the group's timer at the earliest deadline among its members. */
int reg_group_rearm(Registry *r, RegGroup *g);
