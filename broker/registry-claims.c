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
 * bounded per uid and in all, like everything else a peer can make the broker keep. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "registry-internal.h"

bool registry_in_grace(const Registry *r)
{
        return r->in_grace;
}

void reg_restored_forget(Registry *r, RegBuffer *b)
{
        if (!b->restored)
                return;
        b->restored = false;
        list_unlink(&b->restored_link);
}

static void claim_free(Registry *r, Claim *c)
{
        hmap_remove(&r->claims, &c->node);
        list_unlink(&c->peer_link);
        c->peer->n_claim_refs -= c->refs;
        c->peer->acct->claims--;
        r->n_claims--;
        free(c);
}

/* Tells a claimant that its claim cannot be honoured: stop using the memory. */
static void claim_revoke(Registry *r, Claim *c, const char *reason, Outbox *o)
{
        ProtoMsg m;

        proto_event_init(&m, PROTO_EV_REVOKED);
        proto_set_buffer(&m, c->buffer);
        proto_set_generation(&m, c->generation);
        proto_set_name(&m, proto_str(c->name));
        proto_set_kind(&m, c->kind);
        proto_set_reason(&m, proto_str(reason));
        outbox_send(o, c->peer, &m, -1);
        r->counters.events++;
        r->counters.claims_revoked++;
        claim_free(r, c);
}

/* Why b cannot be the publication the reclaim names (so the memory may have changed), or NULL. */
static const char *claim_mismatch(const RegBuffer *b, uint64_t generation, uint32_t owner_uid, ProtoKind kind,
                                  const char *name, char *why, size_t cap)
{
        if (b->owner_uid != owner_uid || b->info.kind != kind)
                snprintf(why, cap, "buffer %llu is now a %s buffer of uid %u, not the %s buffer of uid %u this "
                         "consumer held", (unsigned long long)b->id, proto_kind_name(b->info.kind), b->owner_uid,
                         proto_kind_name(kind), owner_uid);
        else if (b->generation != generation || strcmp(b->name, name) != 0)
                snprintf(why, cap, "buffer %llu was published again (now generation %llu, '%s'; this consumer held "
                         "generation %llu, '%s'): its memory may have been reused", (unsigned long long)b->id,
                         (unsigned long long)b->generation, b->name, (unsigned long long)generation, name);
        else if (b->state == PROTO_STATE_IDLE)
                snprintf(why, cap, "buffer %llu ('%s') drained while this consumer was away: its memory may have "
                         "been reused", (unsigned long long)b->id, b->name);
        else if (b->ring_part)
                snprintf(why, cap, "buffer %llu ('%s') is part of a ring: join the ring again", (unsigned long long)b->id,
                         b->name);
        else
                return NULL;
        return why;
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

void reg_departed_forget(RegBuffer *b)
{
        while (!list_empty(&b->departed)) {
                DepartedHold *d = list_entry(b->departed.next, DepartedHold, link);

                list_unlink(&d->link);
                free(d);
        }
        b->n_departed = 0;
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
 * nobody vouches for (they count as attaches), or a status and why. */
static unsigned reclaim_judge(const Registry *r, const RegPeer *p, RegBuffer *b, const ClaimOf *k, uint32_t refs,
                              uint32_t *as_attaches, char *why, size_t cap)
{
        DepartedHold *d = departed_of(b, p->creds.uid);
        uint32_t unvouched = refs - (d ? MIN(d->refs, refs) : 0);
        unsigned status;

        if (claim_mismatch(b, k->generation, k->owner_uid, k->kind, k->name, why, cap))
                return PROTO_STATUS_REVOKED;
        status = reg_attach_diagnose(b, p, why, cap);
        if (status)
                return status;
        *as_attaches = 0;
        if (unvouched == 0)
                return 0;
        if (b->state != PROTO_STATE_LIVE) {
                /* Registered retired by its returning producer during the grace: holders of the old
                 * broker may come back, and the broker cannot tell which. */
                if (b->restored && r->in_grace)
                        return 0;
                snprintf(why, cap, "buffer %llu ('%s') is retired and the broker knows of no reference of uid %u "
                         "on it: a reclaim takes back references this uid held when its connection ended, or "
                         "what an attach would grant, and an attach of a retired buffer grants none",
                         (unsigned long long)b->id, b->name, p->creds.uid);
                return PROTO_STATUS_REVOKED;
        }
        if (b->retire_after && (b->attaches >= b->retire_after || unvouched > b->retire_after - b->attaches)) {
                snprintf(why, cap, "buffer %llu ('%s') retires after %u attaches and has had %u: %u references "
                         "that the broker cannot vouch for count as attaches and would pass that",
                         (unsigned long long)b->id, b->name, b->retire_after, b->attaches, unvouched);
                return PROTO_STATUS_REVOKED;
        }
        *as_attaches = unvouched;
        return 0;
}

/* Turns a judged reclaim of a registered buffer into references. 0, or -ENOMEM. */
static int reclaim_into(Registry *r, RegPeer *p, RegBuffer *b, uint32_t refs, uint32_t as_attaches)
{
        DepartedHold *d;

        if (reg_hold_add(r, p, b, refs, reg_memory_of(b)->fd >= 0) < 0)
                return -ENOMEM;
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

void registry_reclaim(Registry *r, RegPeer *p, uint64_t id, const RegReclaim *a, Outbox *out)
{
        RegBuffer *b = reg_buffer_lookup(r, a->buffer);
        const ClaimOf k = { a->generation, a->owner_uid, a->kind, a->name };
        char why[PROTO_MAX_TEXT + 1];
        size_t len = strlen(a->name);
        uint32_t as_attaches;
        unsigned status;
        ProtoMsg m;
        Claim *c;

        if (a->refs == 0) {
                reg_reply_err(out, p, id, PROTO_STATUS_INVALID, "a reclaim names at least one reference");
                return;
        }
        if (a->refs > r->limits.refs_per_peer || p->n_refs + p->n_claim_refs > r->limits.refs_per_peer - a->refs) {
                reg_reply_err(out, p, id, PROTO_STATUS_QUOTA, "this connection holds %u references; %u more would "
                              "pass the limit of %u", p->n_refs + p->n_claim_refs, a->refs, r->limits.refs_per_peer);
                return;
        }
        if (b) {
                status = reclaim_judge(r, p, b, &k, a->refs, &as_attaches, why, sizeof(why));
                if (status) {
                        r->counters.reclaims_refused++;
                        reg_reply_err(out, p, id, status, "%s", why);
                        return;
                }
                if (reclaim_into(r, p, b, a->refs, as_attaches) < 0) {
                        registry_peer_mark_lost(p);
                        return;
                }
                proto_reply_init(&m, id, PROTO_STATUS_OK);
                proto_set_state(&m, b->state);
                outbox_send(out, p, &m, -1);
                /* Like the attach that retires it: the reply first, then the events. */
                if (reg_attaches_used_up(b))
                        reg_buffer_retire(r, b, out);
                return;
        }
        if (!r->in_grace) {
                r->counters.reclaims_refused++;
                reg_reply_err(out, p, id, PROTO_STATUS_REVOKED,
                              "buffer %llu ('%s') is not registered, and its producer did not register it again "
                              "within the broker's restart grace (%u ms after the broker started)",
                              (unsigned long long)a->buffer, a->name, r->restart_grace_ms);
                return;
        }
        /* Nobody can vouch for a claim yet, and each one is memory: bounded per uid and in all. */
        if (p->acct->claims >= r->limits.claims_per_uid) {
                reg_reply_err(out, p, id, PROTO_STATUS_QUOTA, "uid %u has %u pending claims (the limit): they wait "
                              "for their producers until the restart grace ends", p->creds.uid, p->acct->claims);
                return;
        }
        if (r->n_claims >= r->limits.claims) {
                reg_reply_err(out, p, id, PROTO_STATUS_QUOTA, "the broker keeps %llu pending claims (the limit for all "
                              "peers together) until the restart grace ends", (unsigned long long)r->n_claims);
                return;
        }
        /* Its producer has not come back yet: the claim waits for it, until the grace ends. */
        c = calloc(1, sizeof(*c) + len + 1);
        if (!c || hmap_insert(&r->claims, &c->node, hash_u64(a->buffer)) < 0) {
                free(c);
                registry_peer_mark_lost(p);
                return;
        }
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
        proto_reply_init(&m, id, PROTO_STATUS_OK);
        proto_set_pending(&m, true);
        outbox_send(out, p, &m, -1);
}

void reg_claims_adopt(Registry *r, RegBuffer *b, Outbox *o)
{
        uint64_t h = hash_u64(b->id);
        char why[PROTO_MAX_TEXT + 1];
        HNode *n, *next;

        if (r->n_claims == 0)
                return;
        for (n = hmap_bucket(&r->claims, h); n; n = next) {
                Claim *c = container_of(n, Claim, node);
                const ClaimOf k = { c->generation, c->owner_uid, c->kind, c->name };
                uint32_t refs = c->refs, as_attaches;
                RegPeer *p = c->peer;

                next = n->next;
                if (n->hash != h || c->buffer != b->id)
                        continue;
                if (reclaim_judge(r, p, b, &k, refs, &as_attaches, why, sizeof(why))) {
                        r->counters.reclaims_refused++;
                        claim_revoke(r, c, why, o);
                        continue;
                }
                claim_free(r, c);
                if (reclaim_into(r, p, b, refs, as_attaches) < 0)
                        registry_peer_mark_lost(p);
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

void reg_grace_end(Registry *r, Outbox *o)
{
        char why[PROTO_MAX_TEXT + 1];

        r->in_grace = false;
        reg_rings_grace_end(r, o);
        /* Claims whose producer never came back: the memory is nobody's any more. */
        snprintf(why, sizeof(why), "its producer did not register it again within the broker's restart grace (%u ms "
                 "after the broker started)", r->restart_grace_ms);
        for (RegPeer *p = registry_peer_first(r); p && r->n_claims; p = registry_peer_next(r, p))
                while (!list_empty(&p->claims))
                        claim_revoke(r, list_entry(p->claims.next, Claim, peer_link), why, o);
        /* Holders that did not come back are gone: restored buffers may drain now. */
        while (!list_empty(&r->restored)) {
                RegBuffer *b = list_entry(r->restored.next, RegBuffer, restored_link);

                reg_restored_forget(r, b);
                if (b->reclaimed)
                        snprintf(why, sizeof(why), "the broker restarted: %u holder(s) came back and released it; "
                                 "holders that did not reconnect within the %u ms restart grace are treated as gone",
                                 b->reclaimed, r->restart_grace_ms);
                else
                        snprintf(why, sizeof(why), "the broker restarted and no holder reclaimed it within the %u ms "
                                 "restart grace; holders that did not reconnect are treated as gone",
                                 r->restart_grace_ms);
                reg_buffer_drain_if_done(r, b, why, o);
        }
}
