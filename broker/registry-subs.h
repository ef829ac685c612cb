/* registry-subs.c: subscriptions and the events they are sent. */
#pragma once

#include "registry-core.h"

typedef struct Sub {
        uint64_t id;
        RegPeer *peer;
        List peer_link, link;
        uint32_t prefix_len;
        uint32_t cost; /* charged to its peer's uid (held budget) */
        char prefix[];
} Sub;

/* Tells every subscriber whose prefix matches the buffer's name. */
void reg_notify_subscribers(Registry *r, ProtoEvent ev, const RegBuffer *b, RegWhy why, RegSink *o);

void reg_sub_free(Registry *r, Sub *s);
