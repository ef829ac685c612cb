/* Reading a safetensors header with bounds: see safetensors.h. */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jsonread.h"
#include "safetensors.h"

/* The format's dtypes: the name a header spells and the bits of one element. Bits, not bytes, since
 * F4 and the F6 types pack several elements a byte: a tensor's byte size is only whole for some
 * element counts (check_size). */
static const struct {
        const char *name;
        unsigned bits;
} dtypes[ST_N_DTYPES] = {
        [ST_BOOL] = { "BOOL", 8 },       [ST_U8] = { "U8", 8 },           [ST_I8] = { "I8", 8 },
        [ST_I16] = { "I16", 16 },        [ST_U16] = { "U16", 16 },        [ST_I32] = { "I32", 32 },
        [ST_U32] = { "U32", 32 },        [ST_I64] = { "I64", 64 },        [ST_U64] = { "U64", 64 },
        [ST_F16] = { "F16", 16 },        [ST_BF16] = { "BF16", 16 },      [ST_F32] = { "F32", 32 },
        [ST_F64] = { "F64", 64 },        [ST_C64] = { "C64", 64 },        [ST_F8_E4M3] = { "F8_E4M3", 8 },
        [ST_F8_E5M2] = { "F8_E5M2", 8 }, [ST_F8_E8M0] = { "F8_E8M0", 8 }, [ST_F4] = { "F4", 4 },
        [ST_F6_E2M3] = { "F6_E2M3", 6 }, [ST_F6_E3M2] = { "F6_E3M2", 6 },
};

const char *safetensors_dtype_name(SafetensorsDtype d)
{
        return d < ST_N_DTYPES ? dtypes[d].name : "?";
}

unsigned safetensors_dtype_bits(SafetensorsDtype d)
{
        return d < ST_N_DTYPES ? dtypes[d].bits : 0;
}

/* The 8 bytes are a little-endian u64. Checked before anything is allocated for the header: the
 * format's limit first (a length no writer makes, whatever the file), then the file's size (a
 * truncated file), then a floor of "{}". */
int safetensors_header_len(const uint8_t first8[8], uint64_t file_size, uint64_t *ret, char *err, size_t cap)
{
        uint64_t n = 0;

        for (int i = 7; i >= 0; i--)
                n = n << 8 | first8[i];
        if (n > SAFETENSORS_MAX_HEADER) {
                snprintf(err, cap, "byte 0: the header length %" PRIu64 " is over the format's limit of %u bytes", n,
                         SAFETENSORS_MAX_HEADER);
                return -EBADMSG;
        }
        if (file_size < 8 || n > file_size - 8) {
                snprintf(err, cap,
                         "byte 0: the header length %" PRIu64 " goes past the end of the %" PRIu64 "-byte file", n,
                         file_size);
                return -EBADMSG;
        }
        if (n < 2) {
                snprintf(err, cap, "byte 0: the header length %" PRIu64 " is too short for a JSON object", n);
                return -EBADMSG;
        }
        *ret = n;
        return 0;
}

SafetensorsHeader *safetensors_header_free(SafetensorsHeader *h)
{
        if (!h)
                return NULL;
        for (size_t i = 0; i < h->n; i++)
                free(h->tensors[i].name);
        free(h->tensors);
        free(h);
        return NULL;
}

/* What parsing needs besides the reader: the header being built and where errors go. */
typedef struct Parse {
        JsonRead r;
        SafetensorsHeader *h;
        size_t cap;
        char *err;
        size_t err_cap;
        bool failed; /* err holds a message of ours (not the reader's) */
} Parse;

/* A message of ours at the reader's position (a byte of the file: the JSON starts at byte 8). */
__attribute__((format(printf, 2, 3))) static bool fail(Parse *p, const char *fmt, ...)
{
        int n;
        va_list ap;

        /* Only the first failure is told, as in jsonread: what fails after it follows from it. */
        if (p->failed || jsonread_failed(&p->r))
                return false;
        n = snprintf(p->err, p->err_cap, "byte %zu: ", (size_t)(p->r.p - p->r.start) + 8);
        va_start(ap, fmt);
        if (n >= 0 && (size_t)n < p->err_cap)
                vsnprintf(p->err + n, p->err_cap - (size_t)n, fmt, ap);
        va_end(ap);
        p->failed = true;
        return false;
}

/* An exact, case-sensitive match of the format's names: a dtype we do not know is refused, since
 * its element size, and so the tensor's bytes, would be a guess. */
static bool read_dtype(Parse *p, SafetensorsTensor *t)
{
        char name[16];

        if (!jsonread_string(&p->r, name, sizeof(name), NULL, "a dtype that no safetensors dtype is"))
                return false;
        for (int d = 0; d < ST_N_DTYPES; d++) {
                if (strcmp(name, dtypes[d].name) == 0) {
                        t->dtype = (SafetensorsDtype)d;
                        return true;
                }
        }
        return fail(p, "tensor '%s': unknown dtype '%s'", t->name, name);
}

/* At most SAFETENSORS_MAX_NDIM dimensions (the fixed array of SafetensorsTensor); [] is a scalar. */
static bool read_shape(Parse *p, SafetensorsTensor *t)
{
        bool first = true;

        if (!jsonread_expect(&p->r, '['))
                return false;
        t->ndim = 0;
        while (jsonread_more(&p->r, ']', &first)) {
                if (t->ndim == SAFETENSORS_MAX_NDIM)
                        return fail(p, "tensor '%s': more than %d dimensions", t->name, SAFETENSORS_MAX_NDIM);
                if (!jsonread_u64(&p->r, &t->shape[t->ndim++], "a dimension that is not an unsigned integer"))
                        return false;
        }
        return !jsonread_failed(&p->r);
}

/* [begin, end) relative to the data that follows the header; it must lie within the file, which is
 * what lets a loader read each tensor by offset without checking again. */
static bool read_offsets(Parse *p, SafetensorsTensor *t)
{
        bool first = true;
        int n = 0;
        uint64_t v[2];

        if (!jsonread_expect(&p->r, '['))
                return false;
        while (jsonread_more(&p->r, ']', &first)) {
                if (n == 2)
                        return fail(p, "tensor '%s': data_offsets has more than two numbers", t->name);
                if (!jsonread_u64(&p->r, &v[n++], "an offset that is not an unsigned integer"))
                        return false;
        }
        if (jsonread_failed(&p->r))
                return false;
        if (n != 2)
                return fail(p, "tensor '%s': data_offsets needs two numbers, not %d", t->name, n);
        if (v[0] > v[1])
                return fail(p, "tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] ends before it begins", t->name,
                            v[0], v[1]);
        if (v[1] > p->h->data_size)
                return fail(p, "tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] go past the data's %" PRIu64
                            " bytes (the file ends at byte %" PRIu64 ")", t->name, v[0], v[1], p->h->data_size,
                            p->h->data_start + p->h->data_size);
        t->begin = v[0];
        t->end = v[1];
        return true;
}

/* The tensor's size in bytes from its shape and dtype, checked against its byte range. */
static bool check_size(Parse *p, const SafetensorsTensor *t)
{
        uint64_t n = 1, bits = safetensors_dtype_bits(t->dtype);

        for (uint32_t i = 0; i < t->ndim; i++) {
                if (t->shape[i] && n > UINT64_MAX / t->shape[i])
                        return fail(p, "tensor '%s': its shape's size overflows 64 bits", t->name);
                n *= t->shape[i];
        }
        if (n > UINT64_MAX / bits)
                return fail(p, "tensor '%s': its shape's size overflows 64 bits", t->name);
        /* Sub-byte dtypes (F4, F6) must fill whole bytes: the format stores no partial byte. */
        if (n * bits % 8)
                return fail(p, "tensor '%s': %" PRIu64 " %s elements do not fill whole bytes", t->name, n,
                            dtypes[t->dtype].name);
        /* Exact, not "at least": the range is what a loader copies into the tensor, so it must
         * be the tensor's bytes and no more; a dimension of 0 needs an empty range. */
        if (n * bits / 8 != t->end - t->begin)
                return fail(p, "tensor '%s': its shape and dtype make %" PRIu64 " bytes, its data_offsets [%" PRIu64
                            ", %" PRIu64 "] %" PRIu64, t->name, n * bits / 8, t->begin, t->end, t->end - t->begin);
        return true;
}

/* One tensor's object: its three keys in any order, each once, nothing else. */
static bool read_tensor(Parse *p, SafetensorsTensor *t)
{
        bool first = true, have_dtype = false, have_shape = false, have_offsets = false;
        /* The entry's start: a missing key is reported there, not at its closing brace. */
        const char *at = p->r.p;

        if (!jsonread_expect(&p->r, '{'))
                return false;
        while (jsonread_more(&p->r, '}', &first)) {
                /* Room for the longest known key (data_offsets): a longer one cannot be known, and
                 * fails in jsonread_string as an unknown key. */
                char key[16];
                bool *seen;

                if (!jsonread_string(&p->r, key, sizeof(key), NULL, "an unknown key in a tensor's entry") ||
                    !jsonread_expect(&p->r, ':'))
                        return fail(p, "tensor '%s': an unknown key (dtype, shape and data_offsets are known)",
                                    t->name);
                if (strcmp(key, "dtype") == 0)
                        seen = &have_dtype;
                else if (strcmp(key, "shape") == 0)
                        seen = &have_shape;
                else if (strcmp(key, "data_offsets") == 0)
                        seen = &have_offsets;
                else
                        return fail(p, "tensor '%s': unknown key '%s' (dtype, shape and data_offsets are known)",
                                    t->name, key);
                if (*seen)
                        return fail(p, "tensor '%s': '%s' twice", t->name, key);
                *seen = true;
                if (!(seen == &have_dtype ? read_dtype(p, t) : seen == &have_shape ? read_shape(p, t)
                                                                                   : read_offsets(p, t)))
                        return false;
        }
        if (jsonread_failed(&p->r))
                return false;
        if (!have_dtype || !have_shape || !have_offsets) {
                p->r.p = at;
                return fail(p, "tensor '%s': no %s", t->name,
                            !have_dtype ? "dtype" : !have_shape ? "shape" : "data_offsets");
        }
        return check_size(p, t);
}

/* "__metadata__": a map of strings to strings, checked and not kept. */
static bool read_metadata(Parse *p)
{
        bool first = true;

        /* The format allows only string values here; anything else marks a writer we do not know. */
        if (jsonread_peek(&p->r) != '{')
                return fail(p, "__metadata__ is not an object");
        p->r.p++;
        while (jsonread_more(&p->r, '}', &first)) {
                /* A key that is not a string: fails with the reader's own message. */
                if (jsonread_peek(&p->r) != '"')
                        return jsonread_expect(&p->r, '"');
                if (!jsonread_skip(&p->r) || !jsonread_expect(&p->r, ':'))
                        return false;
                if (jsonread_peek(&p->r) != '"')
                        return fail(p, "__metadata__ holds a value that is not a string");
                if (!jsonread_skip(&p->r))
                        return false;
        }
        return !jsonread_failed(&p->r);
}

/* By begin, then end, then name: a total order, so that overlap errors name the same pair on every
 * run. */
static int cmp_begin(const void *a, const void *b)
{
        const SafetensorsTensor *x = *(const SafetensorsTensor *const *)a, *y = *(const SafetensorsTensor *const *)b;

        if (x->begin != y->begin)
                return x->begin < y->begin ? -1 : 1;
        if (x->end != y->end)
                return x->end < y->end ? -1 : 1;
        return strcmp(x->name, y->name);
}

/* No two tensors share a byte, and no name comes twice. */
static int check_layout(SafetensorsHeader *h, char *err, size_t cap)
{
        SafetensorsTensor **by = malloc((h->n ? h->n : 1) * sizeof(*by));

        if (!by)
                return -ENOMEM;
        for (size_t i = 0; i < h->n; i++)
                by[i] = &h->tensors[i];
        /* Sorted by begin, any overlap shows between neighbours: if a later tensor begins inside
         * an earlier one, so does the one right after the earlier, so one pass finds it. */
        qsort(by, h->n, sizeof(*by), cmp_begin);
        for (size_t i = 1; i < h->n; i++) {
                const SafetensorsTensor *a = by[i - 1], *b = by[i];
                if (b->begin < a->end) {
                        snprintf(err, cap,
                                 "byte %" PRIu64 ": tensors '%s' [%" PRIu64 ", %" PRIu64 ") and '%s' [%" PRIu64
                                 ", %" PRIu64 ") overlap", h->data_start + b->begin, a->name, a->begin, a->end, b->name,
                                 b->begin, b->end);
                        free(by);
                        return -EBADMSG;
                }
        }
        free(by);
        return 0;
}

static int cmp_name(const void *a, const void *b)
{
        return strcmp((*(const SafetensorsTensor *const *)a)->name, (*(const SafetensorsTensor *const *)b)->name);
}

/* A name twice would make two tensors of one key in a state dict, one silently lost: refused. */
static int check_names(SafetensorsHeader *h, char *err, size_t cap)
{
        SafetensorsTensor **by = malloc((h->n ? h->n : 1) * sizeof(*by));

        if (!by)
                return -ENOMEM;
        for (size_t i = 0; i < h->n; i++)
                by[i] = &h->tensors[i];
        qsort(by, h->n, sizeof(*by), cmp_name);
        for (size_t i = 1; i < h->n; i++) {
                if (strcmp(by[i - 1]->name, by[i]->name) == 0) {
                        snprintf(err, cap, "byte 8: tensor '%s' appears twice", by[i]->name);
                        free(by);
                        return -EBADMSG;
                }
        }
        free(by);
        return 0;
}

/* Room for one more tensor, doubling from 64: the header's length, checked before parsing, bounds
 * how many entries there can be. */
static bool grow(Parse *p)
{
        SafetensorsTensor *t;
        size_t cap = p->cap ? p->cap * 2 : 64;

        if (p->h->n < p->cap)
                return true;
        t = realloc(p->h->tensors, cap * sizeof(*t));
                /* The old array stays in p->h and is freed with the header. */
        if (!t)
                return false;
        p->h->tensors = t;
        p->cap = cap;
        return true;
}

int safetensors_parse(const char *json, size_t len, uint64_t file_size, SafetensorsHeader **ret, char *err, size_t cap)
{
        Parse p = { .err = err, .err_cap = cap };
        bool first = true, have_meta = false;
        char name[SAFETENSORS_MAX_NAME + 1];
        int r;

        if (file_size < 8 || len > file_size - 8)
                return snprintf(err, cap, "byte 0: the header goes past the end of the file"), -EBADMSG;
        p.h = calloc(1, sizeof(*p.h));
        if (!p.h)
                return -ENOMEM;
        /* Offsets in the header are relative to the data, which starts right after it. */
        p.h->data_start = 8 + (uint64_t)len;
        p.h->data_size = file_size - p.h->data_start;
        jsonread_init(&p.r, json, len);
        if (!jsonread_expect(&p.r, '{'))
                goto bad;
        while (jsonread_more(&p.r, '}', &first)) {
                SafetensorsTensor *t;
                size_t n;

                if (!jsonread_string(&p.r, name, sizeof(name), &n, "a tensor name longer than 4096 bytes") ||
                    !jsonread_expect(&p.r, ':'))
                        goto bad;
                if (strcmp(name, "__metadata__") == 0) {
                        if (have_meta) {
                                fail(&p, "__metadata__ twice");
                                goto bad;
                        }
                        have_meta = true;
                        if (!read_metadata(&p))
                                goto bad;
                        continue;
                }
                if (!grow(&p))
                        goto nomem;
                t = &p.h->tensors[p.h->n];
                memset(t, 0, sizeof(*t));
                t->name = malloc(n + 1);
                if (!t->name)
                        goto nomem;
                memcpy(t->name, name, n + 1);
                /* Counted before it is read: a tensor that fails half-read is freed with the rest. */
                p.h->n++;
                if (!read_tensor(&p, t))
                        goto bad;
        }
        if (jsonread_failed(&p.r))
                goto bad;
        if (!jsonread_at_end(&p.r)) {
                fail(&p, "something follows the header's JSON object");
                goto bad;
        }
        /* Whole-header checks, once every entry is known: names unique, byte ranges disjoint. */
        r = check_names(p.h, err, cap);
        if (r == 0)
                r = check_layout(p.h, err, cap);
        if (r < 0) {
                safetensors_header_free(p.h);
                return r;
        }
        *ret = p.h;
        return 0;
nomem:
        safetensors_header_free(p.h);
        return -ENOMEM;
bad:
        if (!p.failed)
                snprintf(err, cap, "byte %zu: %s", p.r.err_at + 8, p.r.err ? p.r.err : "not a safetensors header");
        safetensors_header_free(p.h);
        return -EBADMSG;
}
