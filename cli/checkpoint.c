/* Opening a safetensors checkpoint and laying it out for one buffer: see checkpoint.h. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint.h"
#include "jsonread.h"

/* ---- msgpack, the little the manifest and the metadata need ---- */

/* A msgpack writer over a growing buffer, or over the caller's fixed one (the publish's metadata,
 * whose room the protocol bounds). A failure (no memory, no room) is sticky: the writers go on as
 * no-ops and the caller looks once, at the end, instead of after every field. */
typedef struct Mp {
        uint8_t *b;
        size_t n, cap;
        bool fixed; /* b is the caller's: never grown */
        bool failed;
} Mp;

/* Appends len bytes, doubling the room (from 4 KiB) so that a manifest of many tensors costs
 * log(n) reallocations, not one per entry. */
static void mp_put(Mp *m, const void *p, size_t len)
{
        if (m->failed)
                return;
        if (m->cap - m->n < len) {
                size_t cap = m->cap ? m->cap : 4096;
                uint8_t *b;
                while (cap - m->n < len)
                        cap *= 2;
                if (m->fixed || !(b = realloc(m->b, cap))) {
                        m->failed = true;
                        return;
                }
                m->b = b;
                m->cap = cap;
        }
        memcpy(m->b + m->n, p, len);
        m->n += len;
}

/* A type byte and a big-endian length or value of `bytes` bytes. */
static void mp_head(Mp *m, uint8_t type, uint64_t v, int bytes)
{
        uint8_t out[9] = { type };

        for (int i = 0; i < bytes; i++)
                out[1 + i] = (uint8_t)(v >> (8 * (bytes - 1 - i)));
        mp_put(m, out, 1 + (size_t)bytes);
}

/* The shortest encoding of v: a manifest of many small shapes stays small. */
static void mp_uint(Mp *m, uint64_t v)
{
        if (v < 128)
                mp_head(m, (uint8_t)v, 0, 0);
        else if (v <= UINT8_MAX)
                mp_head(m, 0xcc, v, 1);
        else if (v <= UINT16_MAX)
                mp_head(m, 0xcd, v, 2);
        else if (v <= UINT32_MAX)
                mp_head(m, 0xce, v, 4);
        else
                mp_head(m, 0xcf, v, 8);
}

/* A str (never bin): the Python side reads keys and dtypes as text. */
static void mp_str(Mp *m, const char *s)
{
        size_t n = strlen(s);

        if (n < 32)
                mp_head(m, (uint8_t)(0xa0 | n), 0, 0);
        else if (n <= UINT8_MAX)
                mp_head(m, 0xd9, n, 1);
        else if (n <= UINT16_MAX)
                mp_head(m, 0xda, n, 2);
        else
                mp_head(m, 0xdb, n, 4);
        mp_put(m, s, n);
}

static void mp_array(Mp *m, uint32_t n)
{
        if (n < 16)
                mp_head(m, (uint8_t)(0x90 | n), 0, 0);
        else if (n <= UINT16_MAX)
                mp_head(m, 0xdc, n, 2);
        else
                mp_head(m, 0xdd, n, 4);
}

static void mp_map(Mp *m, uint32_t n)
{
        mp_head(m, (uint8_t)(0x80 | n), 0, 0); /* our maps have fewer than 16 keys */
}

/* ---- dtypes ---- */

/* The Python package's name of each safetensors dtype (python/gpuipc/dtypes.py); NULL: no framework
 * has it, so no consumer could view it. */
static const char *const py_dtype[ST_N_DTYPES] = {
        [ST_BOOL] = "bool",          [ST_U8] = "uint8",          [ST_I8] = "int8",
        [ST_I16] = "int16",          [ST_U16] = "uint16",        [ST_I32] = "int32",
        [ST_U32] = "uint32",         [ST_I64] = "int64",         [ST_U64] = "uint64",
        [ST_F16] = "float16",        [ST_BF16] = "bfloat16",     [ST_F32] = "float32",
        [ST_F64] = "float64",        [ST_C64] = "complex64",     [ST_F8_E4M3] = "float8_e4m3fn",
        [ST_F8_E5M2] = "float8_e5m2", [ST_F8_E8M0] = "float8_e8m0fnu",
        /* two 4-bit values a byte, as torch's float4_e2m1fn_x2 (and safetensors' torch loader): the
         * last dimension halves */
        [ST_F4] = "float4_e2m1fn_x2",
};

/* ---- files ---- */

/* Reads len bytes at off (a pipe: the next len bytes, off being where the reader stands). A file
 * that ends early is -EIO, which callers word as "ends before ..." with the offset: a truncated
 * download is the usual cause, and the offset says how far it got. */
static int read_exact(int fd, bool pipe, uint64_t off, void *dst, size_t len)
{
        size_t got = 0;

        while (got < len) {
                ssize_t n = pipe ? read(fd, (char *)dst + got, len - got)
                                 : pread(fd, (char *)dst + got, len - got, (off_t)(off + got));
                if (n < 0 && errno == EINTR)
                        continue;
                if (n < 0)
                        return -errno;
                if (n == 0)
                        return -EIO;
                got += (size_t)n;
        }
        return 0;
}

/* Opens one safetensors file ("-": standard input) and parses its header. Only the 8-byte length
 * and the JSON header are read; the length is checked against the file's size and
 * SAFETENSORS_MAX_HEADER (safetensors.c) before the header is allocated, so a corrupt or hostile
 * length cannot make us allocate gigabytes. A pipe is read once, in order: its size is unknown
 * (UINT64_MAX) and the tensors must come in file order. */
static int open_file(CheckpointFile *f, char *err, size_t cap)
{
        struct stat st;
        uint8_t first8[8];
        uint64_t len;
        char *json, why[400];
        int r;

        /* Standard input is duplicated, so that checkpoint_free closing every file's fd never
         * closes fd 0 itself; an fd kept here on a later failure is closed there too. */
        f->fd = strcmp(f->path, "-") == 0 ? fcntl(0, F_DUPFD_CLOEXEC, 0) : open(f->path, O_RDONLY | O_CLOEXEC);
        if (f->fd < 0 || fstat(f->fd, &st) < 0) {
                r = -errno;
                snprintf(err, cap, "%s: %s", f->path, strerror(-r));
                return r;
        }
        if (S_ISDIR(st.st_mode)) {
                snprintf(err, cap, "%s: a directory, not a safetensors file", f->path);
                return -EISDIR;
        }
        /* Whatever can seek is read with pread at the tensors' offsets; only what cannot (a FIFO, a
         * pipe on standard input) is read as a stream, once, front to back. */
        f->pipe = !S_ISREG(st.st_mode) && lseek(f->fd, 0, SEEK_CUR) < 0;
        f->size = f->pipe ? UINT64_MAX : (uint64_t)st.st_size;
        if ((r = read_exact(f->fd, f->pipe, 0, first8, 8)) < 0) {
                snprintf(err, cap, "%s: byte 0: %s", f->path,
                         r == -EIO ? "the file ends before the header's length" : strerror(-r));
                return -EBADMSG;
        }
        if (safetensors_header_len(first8, f->size, &len, why, sizeof(why)) < 0) {
                snprintf(err, cap, "%s: %s", f->path, why);
                return -EBADMSG;
        }
        json = malloc(len);
        if (!json)
                return -ENOMEM;
        if ((r = read_exact(f->fd, f->pipe, 8, json, len)) < 0) {
                free(json);
                snprintf(err, cap, "%s: byte 8: %s", f->path,
                         r == -EIO ? "the file ends inside the header" : strerror(-r));
                return -EBADMSG;
        }
        r = safetensors_parse(json, len, f->size, &f->h, why, sizeof(why));
        free(json);
        if (r == -EBADMSG)
                snprintf(err, cap, "%s: %s", f->path, why);
        return r;
}

/* ---- the index of a sharded checkpoint ---- */

typedef struct IndexEntry {
        char *tensor, *file;
} IndexEntry;

typedef struct Index {
        IndexEntry *v;
        size_t n, cap;
        char **files; /* each shard once, in the order the map first names it */
        size_t n_files;
} Index;

static void index_free(Index *x)
{
        for (size_t i = 0; i < x->n; i++) {
                free(x->v[i].tensor);
                free(x->v[i].file);
        }
        free(x->v);
        free(x->files); /* its strings are the entries' */
}

/* Keeps one weight_map entry (copied: the JSON text is freed once parsed). */
static int index_add(Index *x, const char *tensor, const char *file)
{
        if (x->n == x->cap) {
                size_t cap = x->cap ? 2 * x->cap : 256;
                IndexEntry *v = realloc(x->v, cap * sizeof(*v));
                if (!v)
                        return -ENOMEM;
                x->v = v;
                x->cap = cap;
        }
        x->v[x->n].tensor = strdup(tensor);
        x->v[x->n].file = strdup(file);
        if (!x->v[x->n].tensor || !x->v[x->n].file) {
                free(x->v[x->n].tensor);
                free(x->v[x->n].file);
                return -ENOMEM;
        }
        x->n++;
        return 0;
}

/* A shard's name must be a file in the index's directory: no path, so an index cannot send the
 * loader elsewhere. */
static bool shard_name_ok(const char *s)
{
        return s[0] && !strchr(s, '/') && strcmp(s, ".") != 0 && strcmp(s, "..") != 0;
}

/* Reads the index's "weight_map" (tensor -> shard file) and skips every other key (metadata such as
 * total_size, which the shards' own headers make redundant). Errors name the byte, as for headers.
 * The name buffers are static: they are large, and gpuipcctl reads one index at a time. */
static int index_parse(Index *x, const char *text, size_t len, const char *path, char *err, size_t cap)
{
        static char tensor[SAFETENSORS_MAX_NAME + 1], file[1024];
        JsonRead r;
        bool first = true, found = false;
        int e;

        jsonread_init(&r, text, len);
        if (!jsonread_expect(&r, '{'))
                goto bad;
        while (jsonread_more(&r, '}', &first)) {
                /* Room for the keys an index has (weight_map, metadata): a longer key is refused
                 * with a message that says so rather than skipped. */
                char key[32];
                bool inner = true;

                if (!jsonread_string(&r, key, sizeof(key), NULL, "a key longer than any the index has") ||
                    !jsonread_expect(&r, ':'))
                        goto bad;
                if (strcmp(key, "weight_map") != 0) {
                        if (!jsonread_skip(&r))
                                goto bad;
                        continue;
                }
                found = true;
                if (!jsonread_expect(&r, '{'))
                        goto bad;
                while (jsonread_more(&r, '}', &inner)) {
                        if (!jsonread_string(&r, tensor, sizeof(tensor), NULL,
                                             "a tensor name longer than 4096 bytes") ||
                            !jsonread_expect(&r, ':') ||
                            !jsonread_string(&r, file, sizeof(file), NULL, "a file name longer than 1023 bytes"))
                                goto bad;
                        if (!shard_name_ok(file)) {
                                snprintf(err, cap,
                                         "%s: byte %zu: tensor '%s' is in '%s', which is not a file name in the "
                                         "index's directory", path, (size_t)(r.p - r.start), tensor, file);
                                return -EBADMSG;
                        }
                        if ((e = index_add(x, tensor, file)) < 0)
                                return e;
                }
        }
        if (jsonread_failed(&r) || !jsonread_at_end(&r))
                goto bad;
        if (!found) {
                snprintf(err, cap, "%s: no \"weight_map\": not a sharded checkpoint's index", path);
                return -EBADMSG;
        }
        return 0;
bad:
        /* Without a reader error, the one way here is bytes after the object (jsonread_at_end). */
        if (!r.err)
                jsonread_fail(&r, "something follows the index's JSON object");
        snprintf(err, cap, "%s: byte %zu: %s", path, r.err_at, r.err);
        return -EBADMSG;
}

/* The distinct shard files, in the order the map first names them (that is the order they are
 * opened and laid out in, so the same index always gives the same buffer). A quadratic search is
 * fine: CHECKPOINT_MAX_FILES bounds the files, and real indexes name a few dozen. */
static int index_shards(Index *x, char *err, size_t cap)
{
        x->files = malloc((x->n ? x->n : 1) * sizeof(*x->files));
        if (!x->files)
                return -ENOMEM;
        for (size_t i = 0; i < x->n; i++) {
                size_t j = 0;
                while (j < x->n_files && strcmp(x->files[j], x->v[i].file) != 0)
                        j++;
                if (j == x->n_files) {
                        if (x->n_files == CHECKPOINT_MAX_FILES) {
                                snprintf(err, cap, "the index names more than %d files", CHECKPOINT_MAX_FILES);
                                return -EBADMSG;
                        }
                        x->files[x->n_files++] = x->v[i].file;
                }
        }
        return 0;
}

/* Reads a whole index file, which must be a regular file of at most CHECKPOINT_MAX_INDEX bytes:
 * its size is checked before the allocation, and read_exact's -EIO catches a file that shrank. */
static int index_read(Index *x, const char *path, char *err, size_t cap)
{
        struct stat st;
        char *text;
        int fd = open(path, O_RDONLY | O_CLOEXEC), r;

        if (fd < 0 || fstat(fd, &st) < 0) {
                r = -errno;
                snprintf(err, cap, "%s: %s", path, strerror(-r));
                if (fd >= 0)
                        close(fd);
                return r;
        }
        if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size > CHECKPOINT_MAX_INDEX) {
                snprintf(err, cap, "%s: %s", path, S_ISREG(st.st_mode) ? "larger than an index may be (64 MiB)"
                                                                       : "not a regular file");
                close(fd);
                return -EBADMSG;
        }
        text = malloc((size_t)st.st_size + 1);
        if (!text) {
                close(fd);
                return -ENOMEM;
        }
        r = read_exact(fd, false, 0, text, (size_t)st.st_size);
        close(fd);
        if (r < 0) {
                snprintf(err, cap, "%s: %s", path, r == -EIO ? "it shrank while read" : strerror(-r));
                free(text);
                return r;
        }
        r = index_parse(x, text, (size_t)st.st_size, path, err, cap);
        free(text);
        if (r == 0)
                r = index_shards(x, err, cap);
        return r;
}

/* ---- layout ---- */

static int cmp_tensor_name(const void *a, const void *b)
{
        return strcmp((*(const CheckpointTensor *const *)a)->t->name, (*(const CheckpointTensor *const *)b)->t->name);
}

static int cmp_begin(const void *a, const void *b)
{
        const SafetensorsTensor *x = *(const SafetensorsTensor *const *)a, *y = *(const SafetensorsTensor *const *)b;

        return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : 0;
}

/* Every tensor starts at a multiple of CHECKPOINT_ALIGN (256) in the buffer: what CUDA and the
 * frameworks want of a tensor's start for vectorised access, whatever the file's own packing. */
static uint64_t align_up(uint64_t n)
{
        return (n + CHECKPOINT_ALIGN - 1) / CHECKPOINT_ALIGN * CHECKPOINT_ALIGN;
}

/* One tensor's entry: its dtype and shape as the Python package sees them. */
static int place(Checkpoint *c, size_t file, const SafetensorsTensor *t, uint64_t *offset, char *err, size_t cap)
{
        CheckpointTensor *e = &c->tensors[c->n];
        const char *path = c->files[file].path;

        e->t = t;
        e->file = file;
        e->dtype = py_dtype[t->dtype];
        if (!e->dtype) {
                snprintf(err, cap,
                         "%s: byte %" PRIu64 ": tensor '%s' is %s, which no framework has a dtype for: it "
                         "cannot be placed as a viewable tensor", path, c->files[file].h->data_start + t->begin,
                         t->name, safetensors_dtype_name(t->dtype));
                return -EBADMSG;
        }
        e->ndim = t->ndim;
        memcpy(e->shape, t->shape, sizeof(e->shape));
        if (t->dtype == ST_F4) {
                if (t->ndim == 0 || t->shape[t->ndim - 1] % 2) {
                        snprintf(err, cap, "%s: tensor '%s' is F4 with an odd last dimension: torch's float4_e2m1fn_x2 "
                                 "packs two a byte along it", path, t->name);
                        return -EBADMSG;
                }
                /* The manifest gives torch's shape: one float4_e2m1fn_x2 element holds two values. */
                e->shape[t->ndim - 1] /= 2;
        }
        e->offset = *offset;
        *offset = align_up(*offset + (t->end - t->begin));
        c->data_bytes += t->end - t->begin;
        c->n++;
        return 0;
}

/* Places every tensor of every file, file by file, each file's tensors in file order; the manifest
 * goes after the last. The buffer's layout is a function of the files alone, so loading the same
 * checkpoint twice gives the same offsets. */
static int layout(Checkpoint *c, char *err, size_t cap)
{
        size_t total = 0;
        uint64_t offset = 0;
        int r;

        /* One array for every tensor of every file, sized first: place() then never reallocates. */
        for (size_t f = 0; f < c->n_files; f++)
                total += c->files[f].h->n;
        c->tensors = calloc(total ? total : 1, sizeof(*c->tensors));
        if (!c->tensors)
                return -ENOMEM;
        for (size_t f = 0; f < c->n_files; f++) {
                SafetensorsHeader *h = c->files[f].h;
                const SafetensorsTensor **order = malloc((h->n ? h->n : 1) * sizeof(*order));

                if (!order)
                        return -ENOMEM;
                for (size_t i = 0; i < h->n; i++)
                        order[i] = &h->tensors[i];
                /* file order: the reads go forward through each file (a pipe cannot go back) */
                qsort(order, h->n, sizeof(*order), cmp_begin);
                for (size_t i = 0; i < h->n; i++) {
                        if ((r = place(c, f, order[i], &offset, err, cap)) < 0) {
                                free(order);
                                return r;
                        }
                }
                free(order);
        }
        /* Aligned like a tensor: the manifest starts on a CHECKPOINT_ALIGN boundary after the
         * last one. */
        c->manifest_offset = offset;
        return 0;
}

/* No name twice across the files; with an index, every tensor where the index says. */
static int check_names(Checkpoint *c, const Index *x, const char *index_path, char *err, size_t cap)
{
        CheckpointTensor **by = malloc((c->n ? c->n : 1) * sizeof(*by));
        int r = 0;

        if (!by)
                return -ENOMEM;
        for (size_t i = 0; i < c->n; i++)
                by[i] = &c->tensors[i];
        /* Sorted by name once: duplicates are neighbours, and each index entry is a binary search
         * (a large model has tens of thousands of tensors). */
        qsort(by, c->n, sizeof(*by), cmp_tensor_name);
        for (size_t i = 1; i < c->n && r == 0; i++) {
                if (strcmp(by[i - 1]->t->name, by[i]->t->name) == 0) {
                        snprintf(err, cap, "tensor '%s' is in both %s and %s", by[i]->t->name,
                                 c->files[by[i - 1]->file].path, c->files[by[i]->file].path);
                        r = -EBADMSG;
                }
        }
        if (x && r == 0 && x->n != c->n) {
                snprintf(err, cap, "%s: its weight_map lists %zu tensors, its shards hold %zu", index_path, x->n, c->n);
                r = -EBADMSG;
        }
        for (size_t i = 0; x && r == 0 && i < x->n; i++) {
                CheckpointTensor key_t = { 0 }, *key = &key_t, **hit;
                SafetensorsTensor probe = { .name = x->v[i].tensor };
                const char *base;

                key_t.t = &probe;
                hit = bsearch(&key, by, c->n, sizeof(*by), cmp_tensor_name);
                /* The index names shards by file name; ours are paths in its directory. */
                base = hit ? strrchr(c->files[(*hit)->file].path, '/') : NULL;
                base = base ? base + 1 : hit ? c->files[(*hit)->file].path : NULL;
                if (!hit || strcmp(base, x->v[i].file) != 0) {
                        snprintf(err, cap, "%s: its weight_map puts tensor '%s' in %s, %s", index_path, x->v[i].tensor,
                                 x->v[i].file, hit ? "but another shard holds it" : "which does not hold it");
                        r = -EBADMSG;
                }
        }
        free(by);
        return r;
}

/* The manifest that attach_state_dict() reads at the buffer's end: format, then one
 * [key, dtype, shape, offset] per tensor. Its place and length go into the publish's metadata
 * (checkpoint_meta), so a consumer finds it without scanning. */
static int make_manifest(Checkpoint *c)
{
        Mp m = { 0 };

        mp_map(&m, 2);
        mp_str(&m, "format");
        mp_str(&m, CHECKPOINT_FORMAT);
        mp_str(&m, "entries");
        mp_array(&m, (uint32_t)c->n);
        for (size_t i = 0; i < c->n; i++) {
                const CheckpointTensor *e = &c->tensors[i];
                mp_array(&m, 4);
                mp_str(&m, e->t->name);
                mp_str(&m, e->dtype);
                mp_array(&m, e->ndim);
                for (uint32_t d = 0; d < e->ndim; d++)
                        mp_uint(&m, e->shape[d]);
                mp_uint(&m, e->offset);
        }
        if (m.failed) {
                free(m.b);
                return -ENOMEM;
        }
        c->manifest = m.b;
        c->manifest_len = m.n;
        c->size = c->manifest_offset + m.n;
        return 0;
}

/* Written into the caller's fixed buffer: 0 when it does not fit, rather than a cut map no reader
 * could decode. */
size_t checkpoint_meta(const Checkpoint *c, uint8_t *buf, size_t cap)
{
        Mp m = { .b = buf, .cap = cap, .fixed = true };

        mp_map(&m, 2);
        mp_str(&m, "state_dict");
        mp_map(&m, 2);
        mp_str(&m, "version");
        mp_uint(&m, 1);
        mp_str(&m, "manifest");
        mp_array(&m, 2);
        mp_uint(&m, c->manifest_offset);
        mp_uint(&m, c->manifest_len);
        mp_str(&m, "weights");
        mp_map(&m, 3);
        mp_str(&m, "files");
        mp_uint(&m, c->n_files);
        mp_str(&m, "tensors");
        mp_uint(&m, c->n);
        mp_str(&m, "bytes");
        mp_uint(&m, c->data_bytes);
        return m.failed ? 0 : m.n;
}

/* A pipe's reader must stand at its first tensor: what lies before it is read now. */
static int skip_to_data(CheckpointFile *f, char *err, size_t cap)
{
        uint64_t first = UINT64_MAX;
        /* The smallest begin, not the first entry's: the header lists tensors in any order, and
         * a pipe can only be read forward to the earliest. */
        char sink[4096];

        for (size_t i = 0; i < f->h->n; i++)
                if (f->h->tensors[i].begin < first)
                        first = f->h->tensors[i].begin;
        while (first != UINT64_MAX && first > 0) {
                ssize_t n = read(f->fd, sink, first < sizeof(sink) ? (size_t)first : sizeof(sink));
                if (n < 0 && errno == EINTR)
                        continue;
                if (n <= 0) {
                        snprintf(err, cap, "%s: the data ends before its first tensor", f->path);
                        return -EBADMSG;
                }
                first -= (uint64_t)n;
        }
        return 0;
}

/* An index is named *.json (model.safetensors.index.json by convention); anything else is taken
 * for a safetensors file and its header decides. */
static bool is_index(const char *path)
{
        size_t n = strlen(path);
        return n > 5 && strcmp(path + n - 5, ".json") == 0;
}

/* The shards' paths: the index's directory and each file's name. */
static int shard_paths(Checkpoint *c, const char *index_path, const Index *x)
{
        const char *slash = strrchr(index_path, '/');
        /* The index's directory as given (a relative one stays relative): shards are found
         * beside the index, whatever the working directory. */
        int dir_len = slash ? (int)(slash - index_path + 1) : 0;

        c->files = calloc(x->n_files ? x->n_files : 1, sizeof(*c->files));
        if (!c->files)
                return -ENOMEM;
        for (size_t i = 0; i < x->n_files; i++) {
                c->files[i].fd = -1;
                if (asprintf(&c->files[i].path, "%.*s%s", dir_len, index_path, x->files[i]) < 0) {
                        c->files[i].path = NULL;
                        return -ENOMEM;
                }
                c->n_files++;
        }
        return 0;
}

/* The order is the contract: every header is checked, the layout made and the names cross-checked
 * before a pipe is read past its header, so a bad checkpoint is refused before any buffer exists and
 * before a pipe's data is consumed. */
int checkpoint_open(char *const *paths, size_t n, Checkpoint **ret, char *err, size_t cap)
{
        Checkpoint *c = calloc(1, sizeof(*c));
        Index x = { 0 };
        const char *index_path = NULL;
        int r = 0;

        if (!c)
                return -ENOMEM;
        /* An index stands alone: mixing it with files would leave unclear which copy of a tensor
         * the index meant. */
        if (n == 1 && is_index(paths[0])) {
                index_path = paths[0];
                r = index_read(&x, index_path, err, cap);
                if (r == 0)
                        r = shard_paths(c, index_path, &x);
        } else {
                for (size_t i = 0; i < n; i++) {
                        if (is_index(paths[i])) {
                                snprintf(err, cap, "%s: an index is given alone (its shards are read from it)",
                                         paths[i]);
                                r = -EINVAL;
                                break;
                        }
                }
                if (r == 0 && n > CHECKPOINT_MAX_FILES) {
                        snprintf(err, cap, "more than %d files", CHECKPOINT_MAX_FILES);
                        r = -EINVAL;
                }
                if (r == 0 && !(c->files = calloc(n ? n : 1, sizeof(*c->files))))
                        r = -ENOMEM;
                for (size_t i = 0; r == 0 && i < n; i++) {
                        c->files[i].fd = -1;
                        if (!(c->files[i].path = strdup(paths[i])))
                                r = -ENOMEM;
                        c->n_files++;
                }
        }
        for (size_t i = 0; r == 0 && i < c->n_files; i++)
                r = open_file(&c->files[i], err, cap);
        if (r == 0)
                r = layout(c, err, cap);
        if (r == 0)
                r = check_names(c, index_path ? &x : NULL, index_path, err, cap);
        if (r == 0)
                r = make_manifest(c);
        /* Last: a pipe's bytes up to its first tensor cannot be read again, so this happens only once
         * everything that could refuse the checkpoint has passed. */
        for (size_t i = 0; r == 0 && i < c->n_files; i++)
                if (c->files[i].pipe)
                        r = skip_to_data(&c->files[i], err, cap);
        index_free(&x);
        if (r < 0) {
                checkpoint_free(c);
                return r;
        }
        *ret = c;
        return 0;
}

/* One range per tensor, in layout order, which is file order within each file: what a pipe needs,
 * and what lets gpuipc_buffer_load read each file forward. */
/* NULL when out of memory; the fds stay the checkpoint's (checkpoint_free closes them). */
gpuipc_file_range_t *checkpoint_ranges(const Checkpoint *c)
{
        gpuipc_file_range_t *v = calloc(c->n ? c->n : 1, sizeof(*v));

        for (size_t i = 0; v && i < c->n; i++) {
                const CheckpointTensor *e = &c->tensors[i];
                const CheckpointFile *f = &c->files[e->file];
                v[i] = (gpuipc_file_range_t){ .fd = f->fd, .file_offset = f->h->data_start + e->t->begin,
                                              .offset = (size_t)e->offset, .len = (size_t)(e->t->end - e->t->begin) };
        }
        return v;
}

Checkpoint *checkpoint_free(Checkpoint *c)
{
        if (!c)
                return NULL;
        for (size_t i = 0; i < c->n_files; i++) {
                if (c->files[i].fd >= 0)
                        close(c->files[i].fd);
                free(c->files[i].path);
                safetensors_header_free(c->files[i].h);
        }
        free(c->files);
        free(c->tensors);
        free(c->manifest);
        free(c);
        return NULL;
}
