/* Read-only views of the registry for listings, stat and stats: nothing here changes the registry;
 * what a peer may see of them is inspect.c's decision. Layer: reads the core and rings; no part of
 * the registry calls it (the reply layer and inspect.c do). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "registry-core.h"
#include "registry-rings-core.h"

void registry_buffer_view(const RegBuffer *b, RegBufferView *ret)
{
        *ret = (RegBufferView){
                .id = b->id,
                .generation = b->generation,
                .refs = b->refs,
                .name = b->name,
                .info = b->info,
                .is_view = b->segment != NULL,
                .segment_size = b->segment ? b->segment->info.size : 0,
                .state = b->state,
                .holders = b->holders,
                .owner = b->owner ? b->owner->id : 0,
                .owner_uid = b->owner_uid,
                .owner_pid = b->owner_pid,
                .owner_self_pid = b->owner_self_pid,
                .device = b->device,
                .meta = b->meta_len ? b->meta : NULL,
                .meta_len = b->meta_len,
                .handle = b->handle,
                .restored = b->restored,
                .fd = reg_memory_of((RegBuffer *)b)->fd,
        };
}

RegBuffer *registry_buffer_after(const Registry *r, uint64_t after)
{
        /* Usually the previous page's last buffer is still there: continue right after it. */
        RegBuffer *last = HMAP_FIND(&r->buffers_by_seq, hash_u64(after), RegBuffer, by_seq, b, b->seq == after);

        if (last)
                return registry_buffer_next(r, last);
        list_for_each(pos, &r->buffers) {
                RegBuffer *b = list_entry(pos, RegBuffer, link);
                if (b->seq > after)
                        return b;
        }
        return NULL;
}

/* A listing's cursor is the buffer's registration sequence, not its id: ids are a producer's choice
 * (or random), sequences only grow, which is what makes "after" paging stable. */
uint64_t registry_buffer_cursor(const RegBuffer *b)
{
        return b->seq;
}

RegBuffer *registry_buffer_next(const Registry *r, const RegBuffer *b)
{
        return b->link.next == &r->buffers ? NULL : list_entry(b->link.next, RegBuffer, link);
}

RegBuffer *registry_buffer_by_id(const Registry *r, uint64_t id)
{
        return reg_buffer_lookup(r, id);
}

/* Only the live publication answers to a name: a retired one keeps its name for its holders'
 * listings but can no longer be found by it (an attach by name must get the current version). */
RegBuffer *registry_buffer_by_name(const Registry *r, const char *name)
{
        RegName *e = reg_name_lookup(r, name);
        return e ? e->live : NULL;
}

const char *registry_buffer_name(const RegBuffer *b)
{
        return b->name;
}

bool registry_buffer_ring_part(const RegBuffer *b)
{
        return b->ring_part;
}

void registry_buffer_holders(const RegBuffer *b, void (*fn)(const RegPeer *p, uint32_t refs, void *ud), void *ud)
{
        list_for_each(pos, &b->holds) {
                const Hold *h = list_entry(pos, Hold, buf_link);
                if (h->count)
                        fn(h->peer, h->count, ud);
        }
}

/* A linear walk to the cursor: rings are few (each costs its producer a buffer of quota), unlike
 * buffers. */
RegRing *registry_ring_after(const Registry *r, uint64_t after)
{
        list_for_each(pos, &r->ring_list) {
                RegRing *g = list_entry(pos, RegRing, link);
                if (g->seq > after)
                        return g;
        }
        return NULL;
}

RegRing *registry_ring_next(const Registry *r, const RegRing *g)
{
        return g->link.next == &r->ring_list ? NULL : list_entry(g->link.next, RegRing, link);
}

uint64_t registry_ring_cursor(const RegRing *g)
{
        return g->seq;
}

/* A part's memfd, or -1 while it is not registered. */
static int part_fd(const RegRing *g, uint32_t index)
{
        return g->parts[index] ? g->parts[index]->fd : -1;
}

void registry_ring_view(const RegRing *g, RegRingView *ret)
{
        memset(ret, 0, sizeof(*ret));
        ret->name = g->name;
        ret->kind = g->kind;
        ret->slot_size = g->slot_size;
        ret->n_slots = g->n_slots;
        ret->n_members = g->n_members;
        ret->mode = g->mode;
        ret->lease_ms = g->lease_ms;
        ret->device = g->device;
        ret->owner = g->owner;
        ret->complete = reg_ring_set_up(g);
        ret->ctl_fd = part_fd(g, 0);
        for (uint32_t i = 0; i < g->n_members && i < RING_MAX_MEMBERS; i++) {
                const RingSeat *s = &g->seats[i];
                RegRingSeatView *v = &ret->seats[i];

                v->page_fd = part_fd(g, 1 + g->n_slots + i);
                if (!s->peer && !s->reserved)
                        continue;
                v->epoch = s->epoch;
                v->member = s->peer;
                v->reserved = s->reserved;
                ret->taken++;
        }
}

const char *registry_peer_label(const RegPeer *p)
{
        return p->label;
}

void registry_gauges(const Registry *r, RegGauges *g)
{
        memset(g, 0, sizeof(*g));
        g->peers = r->n_peers;
        g->buffers = r->n_buffers;
        g->refs = r->n_refs;
        g->fds = r->n_fds;
        g->waits = r->n_waits;
        g->subs = r->n_subs;
        g->groups = r->n_groups;
        g->names = r->names.count;
        g->live = r->n_state[PROTO_STATE_LIVE];
        g->retired = r->n_state[PROTO_STATE_RETIRED];
        g->idle = r->n_state[PROTO_STATE_IDLE];
        g->orphaned = r->n_orphaned;
        g->held_memory = r->held_memory;
        g->claims_pending = r->n_claims;
        g->rings = r->n_rings;
        g->ring_members = r->n_seated;
        memcpy(g->shared_bytes, r->shared_bytes, sizeof(g->shared_bytes));
        memcpy(g->held_bytes, r->held_bytes, sizeof(g->held_bytes));
        list_for_each(pos, &r->restored)
                g->restored++;
}

/* A uid with no account has nothing registered now: 0 for both, not an error. */
void registry_uid_bytes(const Registry *r, uint32_t uid, uint64_t *shared, uint64_t *held)
{
        const UidAcct *a = HMAP_FIND((HMap *)&r->uids, hash_u64(uid), UidAcct, node, x, x->uid == uid);

        *shared = a ? a->shared_bytes : 0;
        *held = a ? a->held_bytes : 0;
}

uint64_t registry_epoch(const Registry *r)
{
        return r->epoch;
}

const RegCounters *registry_counters(const Registry *r)
{
        return &r->counters;
}
