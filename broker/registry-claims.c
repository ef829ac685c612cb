/* Reclaims and the restart grace: how references survive a broker restart.
 *
 * A broker that died took every reference count with it, but not the memory: consumers still have
 * it mapped. When they reconnect, they reclaim what they hold (buffer id, the generation they
 * hold, how many references); when producers reconnect, they register their buffers again under
 * the same ids, marked restored. The two may arrive in either order: a reclaim for an id nobody
 * registered yet waits as a Claim until its producer registers it or the grace ends.
 *
 * What this file must never do: let a buffer drain while a holder of the old broker may still come
 * back. A restored buffer therefore does not drain before the grace ends, and a reclaim succeeds
 * only for the very publication the consumer holds (same generation, not drained since), so a
 * consumer never gets a reference to memory that may have been reused under it.
 *
 * Nor may a reclaim give more than the claimant provably held. A reference is vouched for by the
 * broker (it ended a connection of the claimant's uid that held it: a DepartedHold) or by the
 * returning producer (it registered the buffer again, restored, during the grace: its holders of
 * the old broker may come back, and the broker knows no more about them). Anything else is what an
 * attach would have granted: the buffer is live, the attach's checks pass, and each reference counts
 * toward retire_after. Pending claims cost memory before anyone can vouch for them, so they are
 * bounded per uid and in all, like everything else a peer can make the broker keep.
 *
 * Layer: calls the core only; rings (a part takes over claims for its id), waits (the grace's end),
 * peers and registry.c call in. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "registry-claims.h"
#include "registry-core.h"

bool registry_in_grace(const Registry *r)
{
        return r->in_grace;
}

static void claim_free(Registry *r, Claim *c)
{
        hmap_remove(&r->claims, &c->node);
        list_unlink(&c->peer_link);
        c->peer->n_claim_refs -= c->refs;
        c->peer->acct->claims--;
        r->n_claims--;
        reg_uncharge(r, c->peer->creds.uid, c->cost);
        free(c);
}

/* Tells a claimant that its claim cannot be honoured: stop using the memory. */
static void claim_revoke(Registry *r, Claim *c, RegWhy why, RegSink *o)
{
        reg_tell_key(o, c->peer, PROTO_EV_REVOKED, (RegBufferKey){ c->buffer, c->generation, c->name, c->kind }, why);
        r->counters.events++;
        r->counters.claims_revoked++;
        claim_free(r, c);
}

/* Why b cannot be the publication the reclaim names (so the memory may have changed), or false. */
static bool claim_mismatch(const RegBuffer *b, uint64_t generation, uint32_t owner_uid, ProtoKind kind,
                           const char *name, RegWhy *why)
{
        if (b->owner_uid != owner_uid || b->info.kind != kind)
                *why = (RegWhy){ REG_E_CLAIM_OWNER, .claim_owner = { .buffer = b->id, .kind = b->info.kind,
                                                                     .uid = b->owner_uid, .held_kind = kind,
                                                                     .held_uid = owner_uid } };
        else if (b->generation != generation || strcmp(b->name, name) != 0)
                *why = (RegWhy){ REG_E_CLAIM_REPUBLISHED,
                                 .claim_republished = { .name = b->name, .held_name = name, .buffer = b->id,
                                                        .generation = b->generation, .held_generation = generation } };
        else if (b->state == PROTO_STATE_IDLE)
                *why = (RegWhy){ REG_E_CLAIM_DRAINED, .claim_drained = { .name = b->name, .buffer = b->id } };
        else if (b->ring_part)
                *why = (RegWhy){ REG_E_CLAIM_RING_PART, .claim_ring_part = { .name = b->name, .buffer = b->id } };
        else
                return false;
        return true;
}

void reg_departed_note(RegBuffer *b, uint32_t uid, uint32_t refs)
{
        DepartedHold *d;

        list_for_each(pos, &b->departed) {
                d = list_entry(pos, DepartedHold, link);
                if (d->uid == uid) {
                        d->refs = refs > UINT32_MAX - d->refs ? UINT32_MAX : d->refs + refs;
                        return;
                }
        }
        /* Past the bound (or out of memory) the broker merely cannot vouch: that uid's holders
         * reclaim as attaches. */
        if (b->n_departed >= REG_DEPARTED_MAX || !(d = calloc(1, sizeof(*d))))
                return;
        d->uid = uid;
        d->refs = refs;
        list_append(&b->departed, &d->link);
        b->n_departed++;
}

static DepartedHold *departed_of(RegBuffer *b, uint32_t uid)
{
        list_for_each(pos, &b->departed) {
                DepartedHold *d = list_entry(pos, DepartedHold, link);

                if (d->uid == uid)
                        return d;
        }
        return NULL;
}

/* What a reclaim names: the publication the claimant says it holds references on. */
typedef struct ClaimOf {
        uint64_t generation;
        uint32_t owner_uid;
        ProtoKind kind;
        const char *name;
} ClaimOf;

/* Whether p's reclaim of refs references on b may be honoured: 0, with *as_attaches the references
 * nobody vouches for (they count as attaches), or a code and why. */
static int reclaim_judge(const Registry *r, const RegPeer *p, RegBuffer *b, const ClaimOf *k, uint32_t refs,
                         uint32_t *as_attaches, RegWhy *why)
{
        DepartedHold *d = departed_of(b, p->creds.uid);
        uint32_t unvouched = refs - (d ? MIN(d->refs, refs) : 0);
        int e;

        if (claim_mismatch(b, k->generation, k->owner_uid, k->kind, k->name, why))
                return (int)why->code;
        e = reg_attach_diagnose(b, p, why);
        if (e)
                return e;
        *as_attaches = 0;
        if (unvouched == 0)
                return 0;
        if (b->state != PROTO_STATE_LIVE) {
                /* Registered retired by its returning producer during the grace: holders of the old
                 * broker may come back, and the broker cannot tell which. */
                if (b->restored && r->in_grace)
                        return 0;
                return reg_fail(why, (RegWhy){ REG_E_CLAIM_RETIRED,
                                               .claim_retired = { .name = b->name, .buffer = b->id,
                                                                  .uid = p->creds.uid } });
        }
        if (b->retire_after && (b->attaches >= b->retire_after || unvouched > b->retire_after - b->attaches)) {
                return reg_fail(why, (RegWhy){ REG_E_CLAIM_RETIRE_AFTER,
                                               .claim_retire_after = { .name = b->name, .buffer = b->id,
                                                                       .retire_after = b->retire_after,
                                                                       .attaches = b->attaches,
                                                                       .unvouched = unvouched } });
        }
        *as_attaches = unvouched;
        return 0;
}

/* Turns a judged reclaim of a registered buffer into references. 0, -ENOMEM, or REG_E_MEMORY_BUDGET
 * with why (the hold does not fit in the memory budget). */
static int reclaim_into(Registry *r, RegPeer *p, RegBuffer *b, uint32_t refs, uint32_t as_attaches, RegWhy *why)
{
        DepartedHold *d;
        int e;

        e = reg_hold_add(r, p, b, refs, reg_memory_of(b)->fd >= 0, why);
        if (e != 0)
                return e;
        d = departed_of(b, p->creds.uid);
        if (d && refs > as_attaches) {
                d->refs -= refs - as_attaches;
                if (d->refs == 0) {
                        list_unlink(&d->link);
                        b->n_departed--;
                        free(d);
                }
        }
        b->attaches += as_attaches;
        b->reclaimed++;
        r->counters.reclaims++;
        return 0;
}

bool reg_attaches_used_up(const RegBuffer *b)
{
        return b->state == PROTO_STATE_LIVE && b->retire_after && b->attaches >= b->retire_after;
}

int registry_reclaim(Registry *r, RegPeer *p, const RegReclaim *a, RegWhy *why, RegSink *out)
{
        RegBuffer *b = reg_buffer_lookup(r, a->buffer);
        const ClaimOf k = { a->generation, a->owner_uid, a->kind, a->name };
        size_t len = strlen(a->name);
        uint32_t as_attaches;
        uint64_t cost;
        Claim *c;
        int e;

        if (a->refs == 0)
                return reg_fail(why, (RegWhy){ REG_E_RECLAIM_NO_REFS });
        if (a->refs > r->limits.refs_per_peer || p->n_refs + p->n_claim_refs > r->limits.refs_per_peer - a->refs)
                return reg_fail(why, (RegWhy){ REG_E_REFS_LIMIT, .refs_limit = { p->n_refs + p->n_claim_refs, a->refs,
                                                                                 r->limits.refs_per_peer } });
        if (b) {
                e = reclaim_judge(r, p, b, &k, a->refs, &as_attaches, why);
                if (e != 0) {
                        r->counters.reclaims_refused++;
                        return e;
                }
                e = reclaim_into(r, p, b, a->refs, as_attaches, why);
                if (e != 0)
                        return e;
                reg_succeed(out, reg_asker(p), (RegChange){ .reply = REG_RE_STATE, .n = b->state });
                /* Like the attach that retires it: the reply first, then the events. */
                if (reg_attaches_used_up(b))
                        reg_buffer_retire(r, b, out);
                return 0;
        }
        if (!r->in_grace) {
                r->counters.reclaims_refused++;
                return reg_fail(why, (RegWhy){ REG_E_CLAIM_UNKNOWN,
                                               .claim_unknown = { a->buffer, a->name, r->restart_grace_ms } });
        }
        /* Nobody can vouch for a claim yet, and each one is memory: bounded per uid and in all. */
        if (p->acct->claims >= r->limits.claims_per_uid)
                return reg_fail(why, (RegWhy){ REG_E_CLAIMS_PER_UID,
                                               .claims_per_uid = { p->creds.uid, p->acct->claims } });
        if (r->n_claims >= r->limits.claims)
                return reg_fail(why, (RegWhy){ REG_E_CLAIMS_ALL, .claims_all = { r->n_claims } });
        /* Its producer has not come back yet: the claim waits for it, until the grace ends. */
        cost = budget_alloc_cost(sizeof(*c) + len + 1) + REG_INDEX_COST + REG_FRAME_COST;
        e = reg_charge(r, p->creds.uid, cost, why);
        if (e != 0)
                return e;
        c = calloc(1, sizeof(*c) + len + 1);
        if (!c || hmap_insert(&r->claims, &c->node, hash_u64(a->buffer)) < 0) {
                free(c);
                reg_uncharge(r, p->creds.uid, cost);
                return -ENOMEM;
        }
        c->cost = (uint32_t)cost;
        c->buffer = a->buffer;
        c->generation = a->generation;
        c->refs = a->refs;
        c->owner_uid = a->owner_uid;
        c->kind = a->kind;
        c->peer = p;
        memcpy(c->name, a->name, len + 1);
        list_append(&p->claims, &c->peer_link);
        p->n_claim_refs += a->refs;
        p->acct->claims++;
        r->n_claims++;
        reg_succeed(out, reg_asker(p), (RegChange){ .reply = REG_RE_PENDING });
        return 0;
}

void reg_claims_adopt(Registry *r, RegBuffer *b, RegSink *o)
{
        uint64_t h = hash_u64(b->id);
        HNode *n, *next;
        RegWhy why;

        if (r->n_claims == 0)
                return;
        for (n = hmap_bucket(&r->claims, h); n; n = next) {
                Claim *c = container_of(n, Claim, node);
                const ClaimOf k = { c->generation, c->owner_uid, c->kind, c->name };
                uint32_t refs = c->refs, as_attaches;
                RegPeer *p = c->peer;
                int e;

                next = n->next;
                if (n->hash != h || c->buffer != b->id)
                        continue;
                if (reclaim_judge(r, p, b, &k, refs, &as_attaches, &why)) {
                        r->counters.reclaims_refused++;
                        claim_revoke(r, c, why, o);
                        continue;
                }
                claim_free(r, c);
                e = reclaim_into(r, p, b, refs, as_attaches, &why);
                if (e < 0) {
                        registry_peer_mark_lost(p);
                } else if (e > 0) {
                        /* Its uid's budget has no room for the hold: the claimant must stop using the
                         * memory, as if its claim had been refused. */
                        reg_tell_key(o, p, PROTO_EV_REVOKED,
                                     (RegBufferKey){ b->id, b->generation, b->name, b->info.kind }, why);
                        r->counters.events++;
                        r->counters.reclaims_refused++;
                        r->counters.claims_revoked++;
                }
        }
}

bool reg_claim_release(Registry *r, RegPeer *p, uint64_t buffer)
{
        list_for_each(pos, &p->claims) {
                Claim *c = list_entry(pos, Claim, peer_link);

                if (c->buffer != buffer)
                        continue;
                if (c->refs == 1) {
                        claim_free(r, c);
                } else {
                        c->refs--;
                        p->n_claim_refs--;
                }
                return true;
        }
        return false;
}

void reg_claims_drop_peer(Registry *r, RegPeer *p)
{
        while (!list_empty(&p->claims))
                claim_free(r, list_entry(p->claims.next, Claim, peer_link));
}

void reg_claims_grace_end(Registry *r, RegSink *o)
{
        const RegWhy gone = { REG_R_CLAIM_GRACE_OVER, .claim_grace_over = { .grace_ms = r->restart_grace_ms } };

        /* Claims whose producer never came back: the memory is nobody's any more. */
        for (RegPeer *p = registry_peer_first(r); p && r->n_claims; p = registry_peer_next(r, p))
                while (!list_empty(&p->claims))
                        claim_revoke(r, list_entry(p->claims.next, Claim, peer_link), gone, o);
        /* Holders that did not come back are gone: restored buffers may drain now. */
        while (!list_empty(&r->restored)) {
                RegBuffer *b = list_entry(r->restored.next, RegBuffer, restored_link);

                reg_restored_forget(r, b);
                reg_buffer_drain_if_done(
                        r, b,
                        b->reclaimed ? (RegWhy){ REG_R_RESTART_RELEASED,
                                                 .restart_released = { .came_back = b->reclaimed,
                                                                       .grace_ms = r->restart_grace_ms } }
                                     : (RegWhy){ REG_R_RESTART_UNCLAIMED,
                                                 .restart_unclaimed = { .grace_ms = r->restart_grace_ms } },
                        o);
        }
}
