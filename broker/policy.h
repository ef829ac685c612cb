/* Authorization policy: which uid/gid may publish or attach which name prefixes. Pure decisions:
 * parsing text into rules and answering questions; reading the file is the caller's job. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct Policy Policy;

typedef enum PolicyAction {
        POLICY_PUBLISH = 1 << 0,
        POLICY_ATTACH = 1 << 1,
        POLICY_ADMIN = 1 << 2, /* retire or free buffers of other uids */
} PolicyAction;

/* Parses policy text (docs/security.md "Policy file"). On a syntax error returns -EINVAL and
 * fills err (line number and reason); 0 and *ret otherwise. */
int policy_parse(const char *text, size_t len, Policy **ret, char *err, size_t err_cap);

Policy *policy_free(Policy *p);

/* The decision for (uid, gid, action, name). A NULL policy is the built-in default. */
bool policy_allows(const Policy *p, uint32_t uid, uint32_t gid, PolicyAction action, const char *name);

/* Number of rules (for the log line after a reload). */
size_t policy_rule_count(const Policy *p);

/* The distinct uids the rules name (uid=N), in the order they first appear, at most cap of them
 * into uids; returns how many were stored. None for a NULL policy. Statistics per uid are kept
 * for these alone, so that their number is the policy's, not the peers'. */
size_t policy_named_uids(const Policy *p, uint32_t *uids, size_t cap);
