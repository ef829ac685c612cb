/* registry-subs.c: subscribing and unsubscribing (the events subscribers are sent are the core's:
 * reg_notify_subscribers). */
#pragma once

#include "registry-core.h"

/* Ends a subscription (its peer unsubscribed or is leaving). */
void reg_sub_free(Registry *r, Sub *s);
