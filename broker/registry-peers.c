/* Peers in the registry: joining, saying hello, and leaving (which releases, revokes or orphans).
 * Layer: leaving ends a peer in every part, so this calls waits, rings, claims, subs and the core;
 * only registry.c (the registry's end) calls it.
 * What leaving must never do: leave anything of the peer behind (a reference, a wait, a
 * subscription, a seat) or a frame addressed to it; tests/fuzz/fuzz-registry.c checks both. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "registry-claims.h"
#include "registry-core.h"
#include "registry-rings-core.h"
#include "registry-subs.h"
#include "registry-waits.h"

/* The limits in the order a person reads the refusal: the broker's, then the uid's, then the
 * memory the connection itself costs (charged to its uid, given back when it goes). Each check
 * undoes what the ones before it took, so a refused connection leaves nothing behind. */
int registry_peer_add(Registry *r, const PeerCreds *creds, uint64_t now_ms, void *userdata, RegPeer **ret,
                      RegWhy *why)
{
        uint64_t cost = budget_alloc_cost(sizeof(RegPeer)) + r->peer_extra;
        UidAcct *acct;
        RegPeer *p;
        int e;

        if (r->n_peers >= r->limits.connections) {
                if (why)
                        *why = (RegWhy){ REG_E_CONNECTIONS_LIMIT,
                                         .connections_limit = { .limit = r->limits.connections } };
                return REG_E_CONNECTIONS_LIMIT;
        }
        acct = reg_acct_get(r, creds->uid);
        if (!acct)
                return -ENOMEM;
        if (acct->connections >= r->limits.connections_per_uid) {
                if (why)
                        *why = (RegWhy){ REG_E_CONNECTIONS_PER_UID,
                                         .connections_per_uid = { .uid = creds->uid,
                                                                  .connections = acct->connections } };
                reg_acct_put(r, acct);
                return REG_E_CONNECTIONS_PER_UID;
        }
        e = reg_charge(r, creds->uid, cost, why);
        if (e != 0) {
                reg_acct_put(r, acct);
                return e;
        }
        p = calloc(1, sizeof(*p));
        if (!p) {
                reg_uncharge(r, creds->uid, cost);
                reg_acct_put(r, acct);
                return -ENOMEM;
        }
        p->charged = cost;
        p->id = ++r->next_peer_id;
        p->creds = *creds;
        p->acct = acct;
        p->connected_ms = now_ms;
        p->userdata = userdata;
        p->reg = r;
        list_init(&p->lost_link);
        list_init(&p->owned);
        list_init(&p->holds);
        list_init(&p->waits);
        list_init(&p->subs);
        list_init(&p->claims);
        list_init(&p->rings);
        list_init(&p->seats);
        list_init(&p->seat_claims);
        list_append(&r->peers, &p->link);
        acct->connections++;
        r->n_peers++;
        r->counters.peers_added++;
        *ret = p;
        return 0;
}

/* What a departing producer's buffer becomes: forgotten when nothing holds it, kept (orphaned) when
 * broker-held, else revoked. A segment that views outlive is kept for them (they are broker-held
 * like it) and goes with the last of them. */
static void drop_owned(Registry *r, RegBuffer *b, RegWhy reason, RegSink *out)
{
        list_unlink(&b->owner_link);
        if (b->n_views == 0 &&
            (b->state == PROTO_STATE_IDLE || (b->state == PROTO_STATE_RETIRED && b->refs == 0))) {
                reg_buffer_destroy(r, b, out);
        } else if (b->info.broker_held) {
                /* The broker keeps the memory (its fd) until the buffer is retired and drained. */
                b->owner = NULL;
                r->n_orphaned++;
                b->free_on_drain = true;
        } else {
                reg_buffer_revoke(r, b, reason, out);
        }
}

/* The order matters: its waits, subscriptions and claims first (nothing may answer or notify it any
 * more), then its seats in rings, then its references (so retired buffers it held drain), and only
 * then what it produced, which holders hear of as revoked with the producer named. */
void registry_peer_remove(Registry *r, RegPeer *p, RegSink *out)
{
        RegWhy reason;

        if (!p)
                return;
        reason = (RegWhy){ REG_R_PRODUCER_GONE,
                           .producer_gone = { .producer = { .peer = p->id, .pid = p->creds.pid,
                                                            .uid = p->creds.uid } } };
        /* A group it joined goes on without it (rearmed for the others), or goes if it was the last. */
        list_for_each_safe(pos, &p->waits) {
                Wait *w = list_entry(pos, Wait, peer_link);
                RegGroup *g = w->group;

                if (!g) {
                        reg_wait_free(r, w);
                        continue;
                }
                reg_join_free(r, w);
                if (g->joined == 0)
                        reg_group_free(r, g);
                else
                        reg_group_rearm(r, g);
        }
        while (!list_empty(&p->subs))
                reg_sub_free(r, list_entry(p->subs.next, Sub, peer_link));
        reg_claims_drop_peer(r, p);
        reg_rings_drop_peer(r, p, out);

        /* Its references vanish; a retired buffer it was the last holder of drains now. */
        while (!list_empty(&p->holds)) {
                Hold *h = list_entry(p->holds.next, Hold, peer_link);
                RegBuffer *b = h->buf;

                /* The broker can vouch for these if a peer of its uid comes back to reclaim them. */
                if (b->owner != p && h->count)
                        reg_departed_note(b, p->creds.uid, h->count);
                reg_hold_drop(r, h);
                if (b->owner != p)
                        reg_buffer_drain_if_done(r, b, (RegWhy){ REG_WHY_NONE }, out);
        }

        /* Views first, so that each segment is judged with the views that outlive the producer; the
         * segments wait for the second pass (leaving), which keeps this walk's next entry alive. */
        p->leaving = true;
        list_for_each_safe(pos, &p->owned) {
                RegBuffer *b = list_entry(pos, RegBuffer, owner_link);

                if (b->segment)
                        drop_owned(r, b, reason, out);
        }
        while (!list_empty(&p->owned))
                drop_owned(r, list_entry(p->owned.next, RegBuffer, owner_link), reason, out);

        /* Frames queued for it earlier in this batch (say, another producer's revoke) must not
         * outlive it: the caller would look it up after it is gone. */
        reg_emit(out, &(RegChange){ .type = REG_CH_FORGET_PEER, .to = p });
        list_unlink(&p->link);
        list_unlink(&p->lost_link);
        p->acct->connections--;
        reg_acct_put(r, p->acct);
        r->n_peers--;
        r->counters.peers_removed++;
        reg_uncharge(r, p->creds.uid, p->charged);
        free(p->gpus);
        free(p);
}

/* Once per connection: what a peer declares is fixed for its life, so a diagnosis made from it
 * (same-pid, device) cannot be dodged by declaring something else later. The GPU list costs memory,
 * charged to the uid like the connection. */
int registry_peer_hello(Registry *r, RegPeer *p, const PeerHello *h, RegWhy *why)
{
        uint64_t cost = h->n_gpus ? budget_alloc_cost(h->n_gpus * sizeof(*p->gpus)) : 0;
        int e;

        if (p->hello) {
                if (why)
                        *why = (RegWhy){ REG_E_HELLO_AGAIN };
                return REG_E_HELLO_AGAIN;
        }
        if (h->n_gpus) {
                e = reg_charge(r, p->creds.uid, cost, why);
                if (e != 0)
                        return e;
                p->gpus = calloc(h->n_gpus, sizeof(*p->gpus));
                if (!p->gpus) {
                        reg_uncharge(r, p->creds.uid, cost);
                        return -ENOMEM;
                }
                p->charged += cost;
                for (uint32_t i = 0; i < h->n_gpus; i++)
                        copy_str(p->gpus[i], sizeof(p->gpus[i]), h->gpus[i]);
                p->n_gpus = h->n_gpus;
        }
        p->decl_pid = h->pid;
        p->decl_pidns = h->pidns;
        p->decl_shm_dev = h->shm_dev;
        p->decl_shm_ino = h->shm_ino;
        copy_str(p->label, sizeof(p->label), h->label);
        p->hello = true;
        return 0;
}

uint32_t registry_peer_refs(const RegPeer *p)
{
        return p->n_refs;
}

bool registry_peer_said_hello(const RegPeer *p)
{
        return p->hello;
}

uint64_t registry_peer_id(const RegPeer *p)
{
        return p->id;
}

const PeerCreds *registry_peer_creds(const RegPeer *p)
{
        return &p->creds;
}

void *registry_peer_userdata(const RegPeer *p)
{
        return p->userdata;
}

RegPeer *registry_take_lost(Registry *r)
{
        RegPeer *p = list_first_entry(&r->lost, RegPeer, lost_link);

        if (p)
                list_unlink(&p->lost_link);
        return p;
}

bool registry_peer_lost(const RegPeer *p)
{
        return p->lost;
}

void registry_peer_view(const RegPeer *p, RegPeerView *ret)
{
        *ret = (RegPeerView){
                .id = p->id,
                .creds = p->creds,
                .pidns = peer_pidns(p),
                .pidns_declared = peer_pidns_declared(p),
                .self_pid = peer_self_pid(p),
                .shm_dev = p->decl_shm_dev,
                .shm_ino = p->decl_shm_ino,
                .label = p->label,
                .n_refs = p->n_refs,
                .n_subs = p->n_subs,
                .n_waits = p->n_waits,
                .n_gpus = p->n_gpus,
                .connected_ms = p->connected_ms,
                .gpus = (const char (*)[PROTO_MAX_UUID + 1])p->gpus,
        };
        list_for_each(pos, &p->owned)
                ret->owned++;
}
