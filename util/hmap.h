/* Intrusive hash table with separate chaining, keyed by a 64-bit hash the caller computes.
 * The table never looks inside entries: a lookup names the key comparison (HMAP_FIND). */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "macro.h"

typedef struct HNode {
        struct HNode *next;
        uint64_t hash;
} HNode;

typedef struct HMap {
        HNode **buckets;
        size_t mask; /* n_buckets - 1; 0 with no buckets */
        size_t count;
} HMap;

#define HMAP_INIT { NULL, 0, 0 }

void hmap_deinit(HMap *m);

/* Links n under hash; grows the table first. Returns 0 or -ENOMEM (n is then not linked). */
int hmap_insert(HMap *m, HNode *n, uint64_t hash);

/* Unlinks n, which must be linked in m. */
void hmap_remove(HMap *m, HNode *n);

/* The chain that holds every node with this hash (and others): walk it with ->next, match ->hash. */
static inline HNode *hmap_bucket(const HMap *m, uint64_t hash)
{
        return m->buckets ? m->buckets[hash & m->mask] : NULL;
}

/* The entry of type `type` (linked through its HNode `member`) stored under key_hash for which cond
 * holds, or NULL. cond sees the candidate as `var`:
 *     RegName *e = HMAP_FIND(&r->names, hash_str(name), RegName, node, x, strcmp(x->name, name) == 0);
 * Only entries with that very hash are compared, so cond runs about once per lookup. */
#define HMAP_FIND(m, key_hash, type, member, var, cond)                                                            \
        ({                                                                                                         \
                const uint64_t hmap_h_ = (key_hash);                                                               \
                type *hmap_found_ = NULL;                                                                          \
                for (HNode *hmap_n_ = hmap_bucket((m), hmap_h_); hmap_n_ && !hmap_found_;                          \
                     hmap_n_ = hmap_n_->next) {                                                                    \
                        type *var = container_of(hmap_n_, type, member);                                           \
                        if (hmap_n_->hash == hmap_h_ && (cond))                                                    \
                                hmap_found_ = var;                                                                 \
                }                                                                                                  \
                hmap_found_;                                                                                       \
        })

/* Iteration over all nodes; the callback may not modify the table. */
#define hmap_for_each(node, m) \
        for (size_t _b = 0; (m)->buckets && _b <= (m)->mask; _b++) \
                for (HNode *node = (m)->buckets[_b]; node; node = node->next)

uint64_t hash_bytes(const void *data, size_t len);
uint64_t hash_u64(uint64_t v);

/* Seeds the keyed hash (SipHash-2-4) so peers cannot choose names that collide; call once at start-up. */
void hash_seed(const uint8_t key[16]);
