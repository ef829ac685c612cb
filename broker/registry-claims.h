/* registry-claims.c: reclaims after a restart, pending claims, departed holds and the restart grace. */
#pragma once

#include "registry-core.h"

/* A reclaim for a buffer nobody registered yet (its producer has not reconnected): kept until the
 * producer registers it or the restart grace ends. Its references count against the peer's. */
typedef struct Claim {
        HNode node; /* key: buffer id */
        uint64_t buffer, generation;
        uint32_t refs, owner_uid;
        ProtoKind kind;
        RegPeer *peer;
        List peer_link;
        uint32_t cost; /* charged to its peer's uid (held budget) */
        char name[];
} Claim;

/* Distinct uids a buffer remembers departed holds of; a holder past them reclaims as an attach. */
#define REG_DEPARTED_MAX 16

/* registry-claims.c: a newly registered buffer takes over the claims waiting for its id; a peer's
 * claims go with it; the restart grace ended (claims nobody's producer came back for are revoked,
 * restored buffers may drain). */
void reg_claims_adopt(Registry *r, RegBuffer *b, RegSink *o);
/* b is live and has had its retire_after attaches (reclaims nobody vouched for count as attaches):
 * the caller retires it, once the replies and events of the step are out. */
bool reg_attaches_used_up(const RegBuffer *b);
void reg_claims_drop_peer(Registry *r, RegPeer *p);
/* p releases one reference it holds through a pending claim of buffer. False if it has none. */
bool reg_claim_release(Registry *r, RegPeer *p, uint64_t buffer);
void reg_claims_grace_end(Registry *r, RegSink *o);
/* p's connection ends while it holds refs on b, which stays: remember them for its uid's reclaim
 * (reg_departed_forget, the core's, forgets them once b drains or goes). */
void reg_departed_note(RegBuffer *b, uint32_t uid, uint32_t refs);
