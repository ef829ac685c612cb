/* Intrusive hash table and the keyed hash it uses (SipHash-2-4, written from the paper's definition). */
#include "hmap.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* The paper's test key until hash_seed(): only the broker hashes what peers choose (names), and it
 * seeds from getrandom at start-up; the library and the tests key their tables by their own ids,
 * where a fixed key keeps runs reproducible. */
static uint64_t sip_k0 = 0x0706050403020100ULL, sip_k1 = 0x0f0e0d0c0b0a0908ULL;

void hash_seed(const uint8_t key[16])
{
        memcpy(&sip_k0, key, 8);
        memcpy(&sip_k1, key + 8, 8);
}

#define ROTL(x, b) (uint64_t)(((x) << (b)) | ((x) >> (64 - (b))))
#define SIPROUND()                                                      \
        do {                                                            \
                v0 += v1; v1 = ROTL(v1, 13); v1 ^= v0; v0 = ROTL(v0, 32); \
                v2 += v3; v3 = ROTL(v3, 16); v3 ^= v2;                  \
                v0 += v3; v3 = ROTL(v3, 21); v3 ^= v0;                  \
                v2 += v1; v1 = ROTL(v1, 17); v1 ^= v2; v2 = ROTL(v2, 32); \
        } while (0)

uint64_t hash_bytes(const void *data, size_t len)
{
        const uint8_t *p = data;
        uint64_t v0 = 0x736f6d6570736575ULL ^ sip_k0, v1 = 0x646f72616e646f6dULL ^ sip_k1;
        uint64_t v2 = 0x6c7967656e657261ULL ^ sip_k0, v3 = 0x7465646279746573ULL ^ sip_k1;
        uint64_t m, b = (uint64_t)len << 56;
        size_t i;

        for (i = 0; i + 8 <= len; i += 8) {
                memcpy(&m, p + i, 8); /* little-endian hosts only, which is every target we build for */
                v3 ^= m;
                SIPROUND();
                SIPROUND();
                v0 ^= m;
        }
        /* The last 0 to 7 bytes, with the length's low byte on top: strings that differ only in
         * trailing zero bytes still hash apart. */
        for (size_t j = 0; i + j < len; j++)
                b |= (uint64_t)p[i + j] << (8 * j);
        v3 ^= b;
        SIPROUND();
        SIPROUND();
        v0 ^= b;
        /* Two rounds per word and four to finish are the SipHash-2-4 that the keyed-hash analysis
         * covers: fewer would be faster and no longer the analysed function. */
        v2 ^= 0xff;
        SIPROUND();
        SIPROUND();
        SIPROUND();
        SIPROUND();
        return v0 ^ v1 ^ v2 ^ v3;
}

uint64_t hash_u64(uint64_t v)
{
        return hash_bytes(&v, sizeof(v));
}

/* Doubles the bucket array (a power of two, so a bucket is hash & mask, no division) and relinks
 * every node by its stored hash: nothing is rehashed, and entries never move in memory, so the
 * pointers callers keep to them stay valid. On -ENOMEM the old table is left as it was. */
static int hmap_grow(HMap *m)
{
        size_t n = m->buckets ? (m->mask + 1) * 2 : 16;
        HNode **b = calloc(n, sizeof(*b));

        if (!b)
                return -ENOMEM;
        for (size_t i = 0; m->buckets && i <= m->mask; i++) {
                HNode *node = m->buckets[i];
                while (node) {
                        HNode *next = node->next;
                        node->next = b[node->hash & (n - 1)];
                        b[node->hash & (n - 1)] = node;
                        node = next;
                }
        }
        free(m->buckets);
        m->buckets = b;
        m->mask = n - 1;
        return 0;
}

int hmap_insert(HMap *m, HNode *n, uint64_t hash)
{
        /* Keep the load factor at or under 1 so chains stay short. */
        if (!m->buckets || m->count >= m->mask + 1) {
                int r = hmap_grow(m);
                if (r < 0)
                        return r;
        }
        n->hash = hash;
        n->next = m->buckets[hash & m->mask];
        m->buckets[hash & m->mask] = n;
        m->count++;
        return 0;
}

/* Walks only n's chain (a load factor of at most 1 keeps it about one node long). A node that is
 * not linked is left alone, so removing twice is harmless. */
void hmap_remove(HMap *m, HNode *n)
{
        HNode **pp = &m->buckets[n->hash & m->mask];

        while (*pp && *pp != n)
                pp = &(*pp)->next;
        if (*pp) {
                *pp = n->next;
                n->next = NULL;
                m->count--;
        }
}

void hmap_deinit(HMap *m)
{
        free(m->buckets);
        *m = (HMap)HMAP_INIT;
}
