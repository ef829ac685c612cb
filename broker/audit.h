/* The audit trail: one log record (msg "audit") per publish, attach, release, retire, free, ring and
 * reclaim request, per request the broker refuses (whatever its operation), per connection refused at
 * the door and per peer that leaves, naming who (peer id, uid, pid, pidns), what (name, kind, bytes,
 * buffer id) and how it ended (the protocol status name). It is fed from the I/O layer, where results
 * are known: request_handle opens a request's record, the outbox's reply hook tells how it ended (the
 * one place every reply passes), and peer.c reports departures. The registry writes nothing.
 *
 * Records are rate-limited by token buckets, one per uid and one for the broker, each refilling over
 * a second: a flooding peer costs a bounded number of lines and a counter increment per refused
 * record; the next record that passes is preceded by one that says how many were suppressed. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "creds.h"
#include "proto.h"

typedef struct RegPeer RegPeer;
typedef struct Registry Registry;

#define AUDIT_RATE_DEFAULT 50
#define AUDIT_RATE_MAX 100000

/* on: whether records are written; rate: records a second for the whole broker (a uid gets a quarter
 * of it, at least 1). Called once at start, like log_setup. */
void audit_setup(bool on, uint32_t rate);

/* Opens the record of request m of peer p (the operation, the name it names, the buffer it names as
 * the registry has it now: a release or retire may free it). Until audit_request_end, replies to it
 * that pass audit_replied complete it. */
void audit_request_begin(const Registry *reg, const RegPeer *p, const ProtoMsg *m);

/* Writes the open record if its request was answered and is one the trail keeps (a refusal always
 * is), and closes it. A request that waits is recorded when its answer goes out. Returns whether the
 * request is one the trail keeps (written, suppressed, or to be written with its answer). */
bool audit_request_end(void);

/* The outbox's reply hook (Outbox.replied): a reply to the open request completes its record; a reply
 * to another request (one that waited: an attach or a group join) is recorded on its own. */
void audit_replied(void *ctx, RegPeer *to, const ProtoMsg *m);

/* How a peer left: the peer closed its connection, its process exited, the broker cut it off, or the
 * broker is stopping. */
typedef enum AuditGone { AUDIT_GONE_CLOSED, AUDIT_GONE_EXITED, AUDIT_GONE_DROPPED, AUDIT_GONE_STOPPING } AuditGone;

/* A peer that leaves, with the references it held and the buffers it owned. Its caller records only
 * the departure of a peer that held or owned something or made a request the trail kept: a listing,
 * a ping or a metrics scrape is no sharing, and would drown the rest. */
void audit_peer_gone(uint64_t peer, const PeerCreds *c, AuditGone how, uint32_t refs, uint64_t buffers);

/* A connection the broker refused at accept (status: why, e.g. quota). */
void audit_connection_refused(const PeerCreds *c, unsigned status);

/* Records suppressed by the rate limit since the broker started (stats). */
uint64_t audit_suppressed_total(void);
