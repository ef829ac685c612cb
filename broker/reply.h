/* The reply layer: turns what the registry says happened (registry-change.h) into the protocol's
 * frames, with their texts (broker/reply-text.c) and fds, and answers the requests that the request
 * layer refuses itself. It is the one place below the request layer that encodes a reply or an
 * event; the registry never does. */
#pragma once

#include <stdint.h>

#include "outbox.h"
#include "registry-change.h"

/* Puts the frame(s) of one change into out. */
void reply_change(Outbox *out, const RegChange *c);

/* An error reply to request id of p, with a message (a refusal of the request layer, an undecodable
 * frame, the broker stopping). */
void reply_error(Outbox *out, RegPeer *p, uint64_t id, unsigned status, const char *message);
