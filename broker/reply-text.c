/* The registry's texts, one per RegWhy code (registry-change.h says which facts each one names),
 * worded by area. */
#include "reply-text.h"

#include <stdbool.h>
#include <stdio.h>

#include "proto.h"

/* A number as printf's %llu takes it. */
#define U(x) ((unsigned long long)(x))

/* A borrowed string a text names, "" for none. */
static const char *str(const char *s)
{
        return s ? s : "";
}

/* Both processes of a cuda-legacy attach have the same PID, each in its own namespace. */
static void same_pid_text(const RegWhy *w, char *text, size_t cap)
{
        snprintf(text, cap,
                 "buffer '%s' is cuda-legacy, and its producer (uid %llu) and this consumer are both PID %llu, each "
                 "in its own PID namespace%s: CUDA takes a handle whose exporting PID equals the opener's for one "
                 "of the opener's own and fails with 'invalid device context'. Fix: start one of them at another "
                 "PID (gpuipcctl run -- CMD picks one that no legacy peer uses; an init such as tini in both "
                 "containers puts both at PID 2 again), or publish the buffer as cuda-vmm",
                 str(w->same_pid.name), U(w->same_pid.producer_uid), U(w->same_pid.pid),
                 w->same_pid.producer_declared || w->same_pid.consumer_declared ? " (as they declared)" : "");
}

static void device_text(const RegWhy *w, char *text, size_t cap)
{
        size_t n = (size_t)snprintf(text, cap, "buffer '%s' lives on GPU %s, which this consumer cannot see "
                                    "(it sees: ", str(w->device.name), str(w->device.device));

        for (uint32_t i = 0; i < w->device.n_gpus && n < cap; i++)
                n += (size_t)snprintf(text + n, cap - n, "%s%s", i ? ", " : "", w->device.gpus[i]);
        if (n < cap)
                snprintf(text + n, cap - n, "%s). Fix: give producer and consumer the same "
                         "ResourceClaim, or the same visible devices", w->device.n_gpus ? "" : "no GPU");
}

static const char *part_rule(RegPartRule rule)
{
        switch (rule) {
        case REG_PART_PART_BEYOND:
                return "the part index is beyond the ring's parts (1 control page, its slots, one page per member, and "
                       "a stream ring's counters per member)";
        case REG_PART_PART_TAKEN:
                return "that part is registered already";
        case REG_PART_PART_HELD_OR_RETIRED:
                return "ring parts are neither broker-held nor retired after attaches";
        case REG_PART_SLOT_SHAPE:
                return "a slot has the ring's kind and slot size";
        case REG_PART_SLOT_READ_ONLY:
                return "slots are read-only for members";
        case REG_PART_SLOT_DEVICE:
                return "a slot lives on the ring's device";
        case REG_PART_COUNTERS_SHAPE:
                return "a seat's counters are a writable cuda-vmm buffer of 128 bytes to 64 MiB";
        case REG_PART_COUNTERS_DEVICE:
                return "a seat's counters live on the ring's device";
        case REG_PART_PAGE_SHAPE:
                return "the control page and member pages are memfds of 4096 bytes";
        case REG_PART_CONTROL_READ_ONLY:
                return "the control page is read-only for members";
        case REG_PART_PAGE_WRITABLE:
                return "a member page is writable by its member";
        case REG_PART_RESTORED_GENERATION:
                return "a restored part carries the generation an earlier broker gave it";
        default:
                return "";
        }
}

/* Subscriptions, attach waits and groups (and the broker stopping under them): true if w is one of these. */
static bool waits_text(const RegWhy *w, char *buf, size_t cap)
{
        switch (w->code) {
        case REG_E_SUBS_LIMIT:
                snprintf(buf, cap, "this connection has %llu subscriptions (the limit)", U(w->subs_limit.subs));
                return true;
        case REG_E_NO_SUB:
                snprintf(buf, cap, "this connection has no subscription %llu", U(w->no_sub.sub));
                return true;
        case REG_E_GROUP_EMPTY:
                snprintf(buf, cap, "a group needs at least one member");
                return true;
        case REG_E_GROUP_MISMATCH:
                snprintf(buf, cap, "group '%s' was started with %llu members; this join says %llu",
                         str(w->group_mismatch.group), U(w->group_mismatch.members), U(w->group_mismatch.asked));
                return true;
        case REG_E_GROUP_JOINED:
                snprintf(buf, cap, "this connection already joined group '%s'", str(w->group_joined.group));
                return true;
        case REG_E_WAITS_LIMIT:
                snprintf(buf, cap, "this connection already waits %llu times (the limit)", U(w->waits_limit.waits));
                return true;
        case REG_E_GROUP_TIMEOUT:
                snprintf(buf, cap, "group '%s': %llu of %llu members joined before the earliest member's deadline",
                         str(w->group_timeout.group), U(w->group_timeout.joined), U(w->group_timeout.members));
                return true;
        case REG_E_WAIT_MISSED:
                snprintf(buf, cap, "nothing was live under '%s' for this attach before the timeout: %llu "
                         "publication(s) during the wait were retired before its turn (by retire_after, once "
                         "earlier waiters had attached, or by the producer)", str(w->wait_missed.name),
                         U(w->wait_missed.missed));
                return true;
        case REG_E_WAIT_TIMEOUT:
                snprintf(buf, cap, "nothing was published under '%s' before the timeout", str(w->wait_timeout.name));
                return true;
        case REG_E_STOPPING:
                snprintf(buf, cap, "the broker is stopping");
                return true;
        default:
                return false;
        }
}

/* Reclaims, pending claims and the restart grace: true if w is one of these. */
static bool claims_text(const RegWhy *w, char *buf, size_t cap)
{
        switch (w->code) {
        case REG_E_SEAT_CLAIMS_LIMIT:
                snprintf(buf, cap, "this connection waits for %llu seats of rings that are not back yet (the limit, "
                         "--max-waits-per-peer)", U(w->seat_claims_limit.claims));
                return true;
        case REG_E_CLAIM_OWNER:
                snprintf(buf, cap, "buffer %llu is now a %s buffer of uid %llu, not the %s buffer of uid %llu this "
                         "consumer held", U(w->claim_owner.buffer), proto_kind_name(w->claim_owner.kind),
                         U(w->claim_owner.uid),
                         proto_kind_name(w->claim_owner.held_kind), U(w->claim_owner.held_uid));
                return true;
        case REG_E_CLAIM_REPUBLISHED:
                snprintf(buf, cap, "buffer %llu was published again (now generation %llu, '%s'; this consumer held "
                         "generation %llu, '%s'): its memory may have been reused", U(w->claim_republished.buffer),
                         U(w->claim_republished.generation), str(w->claim_republished.name),
                         U(w->claim_republished.held_generation), str(w->claim_republished.held_name));
                return true;
        case REG_E_CLAIM_DRAINED:
                snprintf(buf, cap, "buffer %llu ('%s') drained while this consumer was away: its memory may have "
                         "been reused", U(w->claim_drained.buffer), str(w->claim_drained.name));
                return true;
        case REG_E_CLAIM_RING_PART:
                snprintf(buf, cap, "buffer %llu ('%s') is part of a ring: join the ring again",
                         U(w->claim_ring_part.buffer), str(w->claim_ring_part.name));
                return true;
        case REG_E_CLAIM_RETIRED:
                snprintf(buf, cap, "buffer %llu ('%s') is retired and the broker knows of no reference of uid %llu "
                         "on it: a reclaim takes back references this uid held when its connection ended, or "
                         "what an attach would grant, and an attach of a retired buffer grants none",
                         U(w->claim_retired.buffer), str(w->claim_retired.name),
                         U(w->claim_retired.uid));
                return true;
        case REG_E_CLAIM_RETIRE_AFTER:
                snprintf(buf, cap, "buffer %llu ('%s') retires after %llu attaches and has had %llu: %llu references "
                         "that the broker cannot vouch for count as attaches and would pass that",
                         U(w->claim_retire_after.buffer), str(w->claim_retire_after.name),
                         U(w->claim_retire_after.retire_after),
                         U(w->claim_retire_after.attaches), U(w->claim_retire_after.unvouched));
                return true;
        case REG_E_RECLAIM_NO_REFS:
                snprintf(buf, cap, "a reclaim names at least one reference");
                return true;
        case REG_E_REFS_LIMIT:
                snprintf(buf, cap, "this connection holds %llu references; %llu more would pass the limit of %llu",
                         U(w->refs_limit.held), U(w->refs_limit.asked), U(w->refs_limit.limit));
                return true;
        case REG_E_CLAIM_UNKNOWN:
                snprintf(buf, cap, "buffer %llu ('%s') is not registered, and its producer did not register it again "
                         "within the broker's restart grace (%llu ms after the broker started)",
                         U(w->claim_unknown.buffer), str(w->claim_unknown.name), U(w->claim_unknown.grace_ms));
                return true;
        case REG_E_CLAIMS_PER_UID:
                snprintf(buf, cap, "uid %llu has %llu pending claims (the limit): they wait for their producers "
                         "until the restart grace ends", U(w->claims_per_uid.uid), U(w->claims_per_uid.claims));
                return true;
        case REG_E_CLAIMS_ALL:
                snprintf(buf, cap, "the broker keeps %llu pending claims (the limit for all peers together) until "
                         "the restart grace ends", U(w->claims_all.claims));
                return true;
        case REG_R_CLAIM_GRACE_OVER:
                snprintf(buf, cap, "its producer did not register it again within the broker's restart grace (%llu ms "
                         "after the broker started)", U(w->claim_grace_over.grace_ms));
                return true;
        case REG_R_RESTART_RELEASED:
                snprintf(buf, cap, "the broker restarted: %llu holder(s) came back and released it; holders that did "
                         "not reconnect within the %llu ms restart grace are treated as gone",
                         U(w->restart_released.came_back), U(w->restart_released.grace_ms));
                return true;
        case REG_R_RESTART_UNCLAIMED:
                snprintf(buf, cap, "the broker restarted and no holder reclaimed it within the %llu ms restart grace; "
                         "holders that did not reconnect are treated as gone", U(w->restart_unclaimed.grace_ms));
                return true;
        case REG_R_RESTORED_UNHELD:
                snprintf(buf, cap, "registered again after the broker restarted, with no holder left");
                return true;
        default:
                return false;
        }
}

/* Publish and views: true if w is one of these. */
static bool publish_text(const RegWhy *w, char *buf, size_t cap)
{
        switch (w->code) {
        case REG_E_NAME_ORPHANED:
                snprintf(buf, cap,
                         "'%s' is held by the broker for uid %llu (buffer %llu, its producer is gone); a peer "
                         "of that uid may publish over it, or retire it",
                         str(w->name_orphaned.name), U(w->name_orphaned.uid), U(w->name_orphaned.buffer));
                return true;
        case REG_E_NAME_TAKEN:
                snprintf(buf, cap, "'%s' is published by another producer (peer %llu, pid %llu, uid %llu)",
                         str(w->name_taken.name), U(w->name_taken.owner.peer),
                         U(w->name_taken.owner.pid), U(w->name_taken.owner.uid));
                return true;
        case REG_E_OTHERS_BUFFER:
                snprintf(buf, cap, "buffer %llu belongs to another peer", U(w->others_buffer.buffer));
                return true;
        case REG_E_NOT_IDLE:
                snprintf(buf, cap, "buffer %llu is %s; retire it and wait for its drained event before publishing it "
                         "again", U(w->not_idle.buffer), proto_state_name(w->not_idle.state));
                return true;
        case REG_E_KEY_TAKEN:
                snprintf(buf, cap, "buffer id %llu is registered already (by peer %llu, uid %llu); draw a new id for "
                         "new memory", U(w->key_taken.buffer), U(w->key_taken.owner.peer), U(w->key_taken.owner.uid));
                return true;
        case REG_E_BUFFERS_LIMIT:
                snprintf(buf, cap, "uid %llu owns %llu buffers (the limit); free some first", U(w->buffers_limit.uid),
                         U(w->buffers_limit.buffers));
                return true;
        case REG_E_HELD_MEMORY_LIMIT:
                snprintf(buf, cap, "uid %llu has %llu bytes of broker-held memory registered; %llu more would pass "
                         "the broker's --max-held-memory-per-uid (%llu): drop weights it no longer needs",
                         U(w->held_memory_limit.uid), U(w->held_memory_limit.held), U(w->held_memory_limit.size),
                         U(w->held_memory_limit.limit));
                return true;
        case REG_E_FDS_LIMIT:
                snprintf(buf, cap, "the broker holds %llu fds for uid %llu (the limit)", U(w->fds_limit.fds),
                         U(w->fds_limit.uid));
                return true;
        case REG_E_OTHERS_SEGMENT:
                snprintf(buf, cap, "segment %llu belongs to another peer", U(w->others_segment.segment));
                return true;
        case REG_E_NOT_A_SEGMENT:
                snprintf(buf, cap, "buffer %llu cannot hold views: it is %s", U(w->not_a_segment.buffer),
                         w->not_a_segment.why == REG_SEGMENT_IS_VIEW        ? "a view itself"
                         : w->not_a_segment.why == REG_SEGMENT_IS_RING_PART ? "part of a ring"
                                                                             : "of another kind than the view");
                return true;
        case REG_E_SEGMENT_FREED:
                snprintf(buf, cap, "segment %llu is being freed: it takes no new views", U(w->segment_freed.segment));
                return true;
        case REG_E_NO_SEGMENT:
                snprintf(buf, cap, "segment %llu is not registered with this broker: send its fd (and segment_size) "
                         "with this publish", U(w->no_segment.segment));
                return true;
        case REG_E_VIEW_OUTSIDE:
                snprintf(buf, cap, "the view [%llu, +%llu) lies outside its %llu-byte segment",
                         U(w->view_outside.offset), U(w->view_outside.size), U(w->view_outside.segment_size));
                return true;
        case REG_E_RESTORED_GENERATION:
                snprintf(buf, cap, "a restored buffer carries the generation an earlier broker gave it (between 1 and "
                         "%llu)", U(w->restored_generation.highest));
                return true;
        default:
                return false;
        }
}

/* Rings, their parts and seats: true if w is one of these. */
static bool rings_text(const RegWhy *w, char *buf, size_t cap)
{
        switch (w->code) {
        case REG_E_PART_OF_NO_RING:
                snprintf(buf, cap, "buffer %llu ('%s') belongs to a ring that is closed, or to a membership that "
                         "ended", U(w->part_of_no_ring.buffer), str(w->part_of_no_ring.name));
                return true;
        case REG_E_RING_MEMBERS_ONLY:
                snprintf(buf, cap, "buffer %llu ('%s') is part of ring '%s': only its members may attach it (and a "
                         "member page only its own member); join the ring", U(w->ring_members_only.buffer),
                         str(w->ring_members_only.name), str(w->ring_members_only.ring));
                return true;
        case REG_E_RING_EXISTS:
                snprintf(buf, cap, "a ring named '%s' exists already", str(w->ring_exists.ring));
                return true;
        case REG_E_RING_BUFFERS_LIMIT:
                snprintf(buf, cap, "uid %llu owns %llu buffers (the limit; a ring counts as one, and each of its parts "
                         "as one)", U(w->ring_buffers_limit.uid), U(w->ring_buffers_limit.buffers));
                return true;
        case REG_E_RING_OTHERS:
                snprintf(buf, cap, "ring '%s' belongs to another producer", str(w->ring_others.ring));
                return true;
        case REG_E_NO_RING:
                snprintf(buf, cap, "no ring '%s'", str(w->no_ring.ring));
                return true;
        case REG_E_PART_MISFIT:
                snprintf(buf, cap, "ring '%s', part %llu: %s", str(w->part_misfit.ring), U(w->part_misfit.index),
                         part_rule(w->part_misfit.rule));
                return true;
        case REG_E_PART_KEY_TAKEN:
                snprintf(buf, cap, "buffer id %llu is registered already (by peer %llu, uid %llu); draw a new id for a "
                         "ring part", U(w->part_key_taken.buffer), U(w->part_key_taken.owner.peer),
                         U(w->part_key_taken.owner.uid));
                return true;
        case REG_E_RING_SETTING_UP:
                snprintf(buf, cap, "ring '%s' is still being set up (%llu of %llu parts registered)",
                         str(w->ring_setting_up.ring), U(w->ring_setting_up.registered), U(w->ring_setting_up.parts));
                return true;
        case REG_E_RING_MEMBER:
                snprintf(buf, cap, "this connection is a member of ring '%s' already (seat %llu)",
                         str(w->ring_member.ring), U(w->ring_member.seat));
                return true;
        case REG_E_RING_NO_SEAT_READY:
                snprintf(buf, cap, "ring '%s' has no seat ready: its producer has not yet given a seat that was let go "
                         "new pages", str(w->ring_no_seat_ready.ring));
                return true;
        case REG_E_RING_FULL:
                snprintf(buf, cap, "ring '%s' has all its %llu member seats taken", str(w->ring_full.ring),
                         U(w->ring_full.seats));
                return true;
        case REG_E_RING_SEATS:
                snprintf(buf, cap, "ring '%s' has %llu seats", str(w->ring_seats.ring), U(w->ring_seats.seats));
                return true;
        case REG_E_SEAT_NOT_WAITING:
                snprintf(buf, cap, "seat %llu of ring '%s' is not waiting for membership %llu (its producer did not "
                         "declare it, or gave it up)", U(w->seat_not_waiting.seat), str(w->seat_not_waiting.ring),
                         U(w->seat_not_waiting.epoch));
                return true;
        case REG_E_RING_GONE:
                snprintf(buf, cap, "ring '%s' is gone: its producer did not declare it again within the broker's "
                         "restart grace", str(w->ring_gone.ring));
                return true;
        case REG_E_NOT_MEMBER:
                snprintf(buf, cap, "this connection is no member of ring '%s'", str(w->not_member.ring));
                return true;
        case REG_R_MEMBER_GRACE_OVER:
                snprintf(buf, cap, "the member did not come back within the broker's restart grace (%llu ms)",
                         U(w->member_grace_over.grace_ms));
                return true;
        case REG_R_RING_GRACE_OVER:
                snprintf(buf, cap, "the ring's producer did not declare it again within the broker's restart grace "
                         "(%llu ms)", U(w->ring_grace_over.grace_ms));
                return true;
        case REG_R_MEMBER_LEFT:
                snprintf(buf, cap, "the member left");
                return true;
        case REG_R_MEMBER_GONE:
                snprintf(buf, cap, "the member disconnected");
                return true;
        case REG_R_EVICTED_UNRETURNED:
                snprintf(buf, cap, "evicted by the producer before its member came back after the broker restarted");
                return true;
        case REG_R_EVICTED_LEASE:
                snprintf(buf, cap, "evicted by the producer: it held up the ring for longer than its %llu ms lease",
                         U(w->evicted_lease.lease_ms));
                return true;
        case REG_R_RING_CLOSED:
                snprintf(buf, cap, "the producer closed the ring");
                return true;
        case REG_R_RING_PRODUCER_GONE:
                snprintf(buf, cap, "the producer (peer %llu, pid %llu, uid %llu) disconnected",
                         U(w->ring_producer_gone.producer.peer), U(w->ring_producer_gone.producer.pid),
                         U(w->ring_producer_gone.producer.uid));
                return true;
        default:
                return false;
        }
}

/* Connections, attach and the buffer a request names, release, retire and free: true if w is one of these. */
static bool attach_text(const RegWhy *w, char *buf, size_t cap)
{
        switch (w->code) {
        case REG_E_SAME_PID:
                same_pid_text(w, buf, cap);
                return true;
        case REG_E_DEVICE:
                device_text(w, buf, cap);
                return true;
        case REG_E_CONNECTIONS_LIMIT:
                snprintf(buf, cap, "the broker has %llu connections (the limit, --max-connections); close some",
                         U(w->connections_limit.limit));
                return true;
        case REG_E_HELLO_AGAIN:
                snprintf(buf, cap, "hello was already received on this connection");
                return true;
        case REG_E_CONNECTIONS_PER_UID:
                snprintf(buf, cap, "uid %llu has %llu connections (the limit, --max-connections-per-uid); close some",
                         U(w->connections_per_uid.uid), U(w->connections_per_uid.connections));
                return true;
        case REG_E_MEMORY_BUDGET:
                if (w->memory_budget.whole_pool)
                        snprintf(buf, cap, "the broker's memory budget is used up: all peers together keep %llu bytes "
                                 "of the %llu it has for them, and this needs %llu more (--memory-budget)",
                                 U(w->memory_budget.used), U(w->memory_budget.limit), U(w->memory_budget.asked));
                else
                        snprintf(buf, cap, "uid %llu has used up its share of the broker's memory budget: it "
                                 "keeps %llu bytes of its %llu, and this needs %llu more (--memory-budget-per-uid); "
                                 "release or close something first", U(w->memory_budget.uid), U(w->memory_budget.used),
                                 U(w->memory_budget.limit), U(w->memory_budget.asked));
                return true;
        case REG_R_PRODUCER_GONE:
                snprintf(buf, cap, "producer (peer %llu, pid %llu, uid %llu) disconnected",
                         U(w->producer_gone.producer.peer), U(w->producer_gone.producer.pid),
                         U(w->producer_gone.producer.uid));
                return true;
        case REG_E_NO_BUFFER:
                snprintf(buf, cap, "no buffer with id %llu", U(w->no_buffer.buffer));
                return true;
        case REG_E_REFS_FULL:
                snprintf(buf, cap, "this connection holds %llu references (the limit); release some first",
                         U(w->refs_full.refs));
                return true;
        case REG_E_NOT_LIVE:
                snprintf(buf, cap, "buffer %llu ('%s') is %s, not live", U(w->not_live.buffer), str(w->not_live.name),
                         proto_state_name(w->not_live.state));
                return true;
        case REG_E_NOTHING_UNDER:
                snprintf(buf, cap, "nothing is published under '%s'", str(w->nothing_under.name));
                return true;
        case REG_E_NOT_ATTACHED:
                snprintf(buf, cap, "this connection holds no reference to buffer %llu", U(w->not_attached.buffer));
                return true;
        case REG_E_NOT_OWNER:
                snprintf(buf, cap, "buffer %llu ('%s') belongs to peer %llu (uid %llu)", U(w->not_owner.buffer),
                         str(w->not_owner.name), U(w->not_owner.owner.peer), U(w->not_owner.owner.uid));
                return true;
        default:
                return false;
        }
}

void reply_text(const RegWhy *w, char *buf, size_t cap)
{
        if (cap)
                buf[0] = 0;
        /* Each area words its own codes; REG_WHY_NONE (and a code nobody knows) stays "". */
        if (!waits_text(w, buf, cap) && !attach_text(w, buf, cap) && !publish_text(w, buf, cap) &&
            !claims_text(w, buf, cap))
                rings_text(w, buf, cap);
}
