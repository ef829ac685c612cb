/* util/: SipHash-2-4 against the reference vectors, the intrusive hash table, the min-heap and the
 * in-place sort. */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "check.h"
#include "heap.h"
#include "hmap.h"
#include "macro.h"
#include "sort.h"

/* ---- SipHash ---- */

/* hash_bytes is SipHash-2-4: the reference implementation's test vectors. */
static void test_siphash_vectors(void)
{
        /* From the SipHash paper's reference implementation (vectors.h): key 00..0f, message
         * 00..len-1; the digest bytes are little-endian. */
        static const uint64_t want[16] = {
                0x726fdb47dd0e0e31ULL, 0x74f839c593dc67fdULL, 0x0d6c8009d9a94f5aULL, 0x85676696d7fb7e2dULL,
                0xcf2794e0277187b7ULL, 0x18765564cd99a68dULL, 0xcbc9466e58fee3ceULL, 0xab0200f58b01d137ULL,
                0x93f5f5799a932462ULL, 0x9e0082df0ba9e4b0ULL, 0x7a5dbbc594ddb9f3ULL, 0xf4b32f46226bada7ULL,
                0x751e8fbc860ee5fbULL, 0x14ea5627c0843d90ULL, 0xf723ca908e7af2eeULL, 0xa129ca6149be45e5ULL,
        };
        uint8_t key[16], msg[16];

        for (unsigned i = 0; i < 16; i++)
                key[i] = msg[i] = (uint8_t)i;
        hash_seed(key);
        for (unsigned len = 0; len < 16; len++)
                CHECK_EQ(hash_bytes(msg, len), want[len]);
}

/* Hashes are deterministic for one key and change with the key, so peers cannot precompute collisions; hash_u64
 * hashes the value's 8 bytes. */
static void test_siphash_seed(void)
{
        uint8_t k1[16] = { 1 }, k2[16] = { 2 };
        uint64_t a, b, c;

        hash_seed(k1);
        a = hash_bytes("frames/0", 8);
        c = hash_u64(42);
        CHECK_EQ(hash_bytes("frames/0", 8), a); /* deterministic for one key */
        hash_seed(k2);
        b = hash_bytes("frames/0", 8);
        CHECK(a != b); /* another key, another hash: peers cannot precompute collisions */
        CHECK(hash_u64(42) != c);
        /* hash_u64 hashes the 8 bytes of the value. */
        {
                uint64_t v = 42;
                CHECK_EQ(hash_u64(42), hash_bytes(&v, sizeof(v)));
        }
}

/* ---- hash table ---- */

typedef struct Item {
        HNode node;
        unsigned key;
        bool seen;
} Item;

static Item *lookup(HMap *m, unsigned key, uint64_t (*hf)(unsigned))
{
        return HMAP_FIND(m, hf(key), Item, node, it, it->key == key);
}

static uint64_t good_hash(unsigned k)
{
        return hash_u64(k);
}

/* Every key in one bucket chain: the table must still work (the caller compares keys). */
static uint64_t bad_hash(unsigned k)
{
        return k & 1 ? 0x100 : 0x200;
}

static void hmap_exercise(uint64_t (*hf)(unsigned))
{
        enum { N = 1000 };
        HMap m = HMAP_INIT;
        Item *items = calloc(N, sizeof(*items));
        size_t count;

        CHECK(items);
        CHECK(hmap_bucket(&m, 123) == NULL); /* empty table has no buckets */
        CHECK_EQ(m.count, 0);
        for (unsigned i = 0; i < N; i++) {
                items[i].key = i;
                CHECK_EQ(hmap_insert(&m, &items[i].node, hf(i)), 0);
                CHECK_EQ(m.count, i + 1);
                CHECK(m.count <= m.mask + 1); /* load factor stays at or under 1 */
        }
        for (unsigned i = 0; i < N; i++)
                CHECK(lookup(&m, i, hf) == &items[i]);
        CHECK(lookup(&m, N + 5, hf) == NULL);

        /* Iteration visits each node exactly once. */
        count = 0;
        hmap_for_each(n, &m) {
                Item *it = container_of(n, Item, node);
                CHECK(!it->seen);
                it->seen = true;
                count++;
        }
        CHECK_EQ(count, N);

        /* Remove the even keys, in an order unrelated to insertion. */
        for (unsigned i = 0; i < N; i += 2)
                hmap_remove(&m, &items[(i * 7) % N].node); /* i even: (i * 7) % N is even too */
        CHECK_EQ(m.count, N / 2);
        for (unsigned i = 0; i < N; i++)
                CHECK((lookup(&m, i, hf) != NULL) == (i % 2 == 1));

        /* Re-insert one and remove everything. */
        CHECK_EQ(hmap_insert(&m, &items[0].node, hf(0)), 0);
        CHECK(lookup(&m, 0, hf) == &items[0]);
        for (unsigned i = 0; i < N; i++)
                if (lookup(&m, i, hf))
                        hmap_remove(&m, &items[i].node);
        CHECK_EQ(m.count, 0);
        hmap_for_each(n, &m) CHECK(!n);
        hmap_deinit(&m);
        CHECK(m.buckets == NULL && m.count == 0 && m.mask == 0);
        hmap_deinit(&m); /* twice is harmless */
        free(items);
}

/* The hash table inserts, finds (HMAP_FIND), removes and grows correctly with a good hash. */
static void test_hmap(void)
{
        hmap_exercise(good_hash);
}

/* The same when all keys share two hash values (long chains): lookups compare keys, not only hashes. */
static void test_hmap_collisions(void)
{
        hmap_exercise(bad_hash);
}

/* ---- heap ---- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ULL;

static uint64_t rng(void)
{
        /* xorshift64*: deterministic, so a failure reproduces. */
        rng_state ^= rng_state >> 12;
        rng_state ^= rng_state << 25;
        rng_state ^= rng_state >> 27;
        return rng_state * 0x2545f4914f6cdd1dULL;
}

static void heap_check_shape(const Heap *h)
{
        for (size_t i = 0; i < h->n; i++) {
                CHECK_EQ(h->v[i]->idx, i);
                if (i)
                        CHECK(h->v[(i - 1) / 2]->key <= h->v[i]->key);
        }
}

/* The timer heap keeps the earliest on top through pushes and removals, and removing a node that is not queued is
 * harmless. */
static void test_heap_basic(void)
{
        Heap h = HEAP_INIT;
        HeapNode a = HEAP_NODE_INIT, b = HEAP_NODE_INIT, c = HEAP_NODE_INIT;

        CHECK(heap_top(&h) == NULL);
        CHECK(!heap_queued(&a));
        heap_remove(&h, &a); /* not queued: harmless */
        CHECK_EQ(heap_push(&h, &a, 30), 0);
        CHECK_EQ(heap_push(&h, &b, 10), 0);
        CHECK_EQ(heap_push(&h, &c, 20), 0);
        CHECK(heap_queued(&a) && heap_queued(&b) && heap_queued(&c));
        CHECK(heap_top(&h) == &b);
        heap_remove(&h, &b);
        CHECK(!heap_queued(&b));
        CHECK(heap_top(&h) == &c);
        heap_remove(&h, &b); /* twice: harmless */
        CHECK_EQ(h.n, 2);
        heap_remove(&h, &a); /* the last one */
        CHECK(heap_top(&h) == &c);
        heap_remove(&h, &c);
        CHECK(heap_top(&h) == NULL);
        /* Equal keys all come out. */
        CHECK_EQ(heap_push(&h, &a, 5), 0);
        CHECK_EQ(heap_push(&h, &b, 5), 0);
        CHECK_EQ(heap_push(&h, &c, 5), 0);
        for (int i = 0; i < 3; i++) {
                HeapNode *t = heap_top(&h);
                CHECK(t && t->key == 5);
                heap_remove(&h, t);
        }
        CHECK(heap_top(&h) == NULL);
        /* A node removed from one heap position and pushed again gets its new key. */
        CHECK_EQ(heap_push(&h, &a, 7), 0);
        heap_remove(&h, &a);
        CHECK_EQ(heap_push(&h, &a, 3), 0);
        CHECK_EQ(heap_top(&h)->key, 3);
        heap_deinit(&h);
        CHECK(h.v == NULL && h.n == 0);
}

/* Thousands of random pushes and removals from anywhere keep the heap property and the queued marks right. */
static void test_heap_random(void)
{
        enum { N = 2000 };
        HeapNode *nodes = calloc(N, sizeof(*nodes));
        Heap h = HEAP_INIT;
        uint64_t last = 0;
        size_t queued = 0;

        CHECK(nodes);
        for (size_t i = 0; i < N; i++)
                nodes[i] = (HeapNode)HEAP_NODE_INIT;
        /* Random pushes and removals from anywhere; the heap property holds throughout. */
        for (int round = 0; round < 20000; round++) {
                HeapNode *n = &nodes[rng() % N];
                if (heap_queued(n)) {
                        heap_remove(&h, n);
                        queued--;
                        CHECK(!heap_queued(n));
                } else {
                        CHECK_EQ(heap_push(&h, n, rng() % 500), 0);
                        queued++;
                }
                CHECK_EQ(h.n, queued);
                if (round % 97 == 0)
                        heap_check_shape(&h);
        }
        heap_check_shape(&h);
        /* Popping yields non-decreasing keys. */
        while (heap_top(&h)) {
                HeapNode *t = heap_top(&h);
                CHECK(t->key >= last);
                last = t->key;
                heap_remove(&h, t);
                queued--;
        }
        CHECK_EQ(queued, 0);
        heap_deinit(&h);
        free(nodes);
}

/* ---- sort ---- */

static int u64_cmp(const void *a, const void *b)
{
        uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
        return x < y ? -1 : x > y;
}

typedef struct Rec {
        uint64_t key;
        uint32_t tag; /* which input position it came from: the sort must move whole records */
        char pad[5];  /* an odd size: sort_array swaps bytes, not words */
} Rec;

static int rec_cmp(const void *a, const void *b)
{
        const Rec *x = a, *y = b;
        return x->key < y->key ? -1 : x->key > y->key;
}

/* Random arrays of every small length and some large ones (with many equal keys) come out in
 * order, each record whole and none lost or doubled. */
static void test_sort_random(void)
{
        static const size_t lengths[] = { 0, 1, 2, 3, 4, 5, 7, 8, 31, 64, 1000, 4099 };

        for (size_t li = 0; li < ARRAY_SIZE(lengths); li++) {
                size_t n = lengths[li];
                Rec *v = calloc(n ? n : 1, sizeof(*v));
                uint32_t *seen = calloc(n ? n : 1, sizeof(*seen));

                CHECK(v && seen);
                for (size_t i = 0; i < n; i++)
                        v[i] = (Rec){ .key = rng() % (n / 3 + 1), .tag = (uint32_t)i, .pad = "abcd" };
                sort_array(v, n, sizeof(*v), rec_cmp);
                for (size_t i = 0; i < n; i++) {
                        CHECK(i == 0 || v[i - 1].key <= v[i].key);
                        CHECK(v[i].tag < n);
                        CHECK_EQ(seen[v[i].tag]++, 0);
                        CHECK(v[i].pad[0] == 'a' && v[i].pad[3] == 'd');
                }
                free(seen);
                free(v);
        }
}

/* Already sorted and reversed inputs, the cases a careless sift gets wrong. */
static void test_sort_ordered_inputs(void)
{
        enum { N = 257 };
        uint64_t up[N], down[N];

        for (size_t i = 0; i < N; i++) {
                up[i] = i;
                down[i] = N - i;
        }
        sort_array(up, N, sizeof(up[0]), u64_cmp);
        sort_array(down, N, sizeof(down[0]), u64_cmp);
        for (size_t i = 0; i < N; i++) {
                CHECK_EQ(up[i], i);
                CHECK_EQ(down[i], i + 1);
        }
}

int main(int argc, char **argv)
{
        TEST_RUN(argc, argv, test_siphash_vectors);
        TEST_RUN(argc, argv, test_siphash_seed);
        TEST_RUN(argc, argv, test_hmap);
        TEST_RUN(argc, argv, test_hmap_collisions);
        TEST_RUN(argc, argv, test_heap_basic);
        TEST_RUN(argc, argv, test_heap_random);
        TEST_RUN(argc, argv, test_sort_random);
        TEST_RUN(argc, argv, test_sort_ordered_inputs);
        return TEST_END();
}
