/* The English of the registry's answers: each RegWhy code and its facts worded as the message of an
 * error reply or the reason of an event. What happened in this case; the status name (and its
 * default text, on the client side) says how to fix it in general. */
#pragma once

#include <stddef.h>

#include "registry-change.h"

/* Writes w's text into buf (cut to cap - 1 bytes, always terminated); "" for REG_WHY_NONE. */
void reply_text(const RegWhy *w, char *buf, size_t cap);
