/* Loading files into buffers (gpuipc_buffer_load): a checkpoint's bytes go from the page cache or
 * the disk straight into shareable memory. For memfd the reads land in the buffer itself; for the
 * CUDA kinds they land in one of two page-locked chunks, whose copies to the device are queued in a
 * stream of ours while the other chunk is read: the disk and the bus work at once, and the load
 * takes about as long as the slower of them. A chunk is written again only once the event recorded
 * after its copies completed. */
#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "clock.h"
#include "cuda.h"
#include "internal.h"
#include "macro.h"

#define LOAD_CHUNK_DEFAULT (64u << 20)
#define LOAD_CHUNK_MIN (64u << 10)
/* Pieces of ranges gathered in a chunk before their reads and copies are issued: a chunk of many
 * small tensors (norms, biases) is issued in parts, which costs nothing but a few more reads. */
#define LOAD_PIECES 256

/* Where a piece of a range goes: `len` bytes at `stage` offset in the chunk, read from file `fd` at
 * `file_offset`, to the buffer's `offset`. */
typedef struct Piece {
        int fd;
        uint64_t file_offset;
        size_t stage, offset, len;
} Piece;

typedef struct Loader {
        gpuipc_t *c;
        gpuipc_buffer_t *b;
        gpuipc_load_options_t o;
        gpuipc_load_stats_t st;
        /* the CUDA kinds' staging */
        GcuStream stream;
        uint8_t *chunk[2];
        GcuEvent done[2];
        bool busy[2];
        Piece pieces[LOAD_PIECES];
        size_t n_pieces;
        struct Stream *streams; /* LOAD_STREAMS of them */
        size_t n_streams;
} Loader;

/* A pipe's read position: it cannot seek, so its ranges are read in order from where it stood. */
typedef struct Stream {
        int fd;
        uint64_t pos;
} Stream;

#define LOAD_STREAMS 16

static int stream_skip(gpuipc_t *c, int fd, uint64_t n)
{
        char sink[4096];

        while (n > 0) {
                ssize_t got = read(fd, sink, n < sizeof(sink) ? (size_t)n : sizeof(sink));
                if (got < 0 && errno == EINTR)
                        continue;
                if (got <= 0) {
                        client_errmsg(c, "fd %d (a pipe) ends %llu bytes before the next range", fd,
                                      (unsigned long long)n);
                        return got < 0 ? -errno : -EIO;
                }
                n -= (uint64_t)got;
        }
        return 0;
}

/* len bytes of fd at off into dst, through short reads and EINTR. An fd that cannot seek (a pipe)
 * is read in order: it must stand at its first range's offset, and what lies between two of its
 * ranges is read and dropped. */
static int read_full(Loader *l, int fd, uint64_t off, void *dst, size_t len)
{
        uint64_t t0 = monotonic_ns();
        Stream *s = NULL;
        size_t got = 0;
        int r;

        for (size_t i = 0; i < l->n_streams; i++)
                if (l->streams[i].fd == fd)
                        s = &l->streams[i];
        while (got < len) {
                ssize_t n;

                if (s && s->pos != off + got) {
                        if (s->pos > off + got) {
                                client_errmsg(l->c, "fd %d is a pipe: its ranges must come in file order (byte %llu "
                                              "after byte %llu)", fd, (unsigned long long)(off + got),
                                              (unsigned long long)s->pos);
                                return GPUIPC_E_INVALID;
                        }
                        if ((r = stream_skip(l->c, fd, off + got - s->pos)) < 0)
                                return r;
                        s->pos = off + got;
                }
                if (s)
                        n = read(fd, (char *)dst + got, len - got);
                else
                        n = pread(fd, (char *)dst + got, len - got, (off_t)(off + got));
                if (n < 0 && errno == EINTR)
                        continue;
                if (n < 0 && errno == ESPIPE && !s) {
                        if (l->n_streams == LOAD_STREAMS) {
                                client_errmsg(l->c, "more than %d pipes in one load", LOAD_STREAMS);
                                return GPUIPC_E_INVALID;
                        }
                        s = &l->streams[l->n_streams++];
                        *s = (Stream){ fd, off + got };
                        continue;
                }
                if (n < 0) {
                        int e = errno;
                        client_errmsg(l->c, "reading fd %d at byte %llu: %s", fd, (unsigned long long)(off + got),
                                      strerror(e));
                        return -e;
                }
                if (n == 0) {
                        client_errmsg(l->c, "fd %d ends at byte %llu, before the %zu bytes wanted from byte %llu", fd,
                                      (unsigned long long)(off + got), len, (unsigned long long)off);
                        return -EIO;
                }
                got += (size_t)n;
                if (s)
                        s->pos += (uint64_t)n;
        }
        l->st.read_ns += monotonic_ns() - t0;
        return 0;
}

static void progress(Loader *l)
{
        if (l->o.progress)
                l->o.progress(l->st.bytes, l->o.progress_ud);
}

/* memfd: each range read into the mapping, a chunk at a time (for the progress calls). */
static int load_host(Loader *l, const gpuipc_file_range_t *ranges, size_t n)
{
        for (size_t i = 0; i < n; i++) {
                for (size_t done = 0; done < ranges[i].len;) {
                        size_t take = ranges[i].len - done < l->o.chunk_size ? ranges[i].len - done : l->o.chunk_size;
                        int r = read_full(l, ranges[i].fd, ranges[i].file_offset + done,
                                          (char *)l->b->ptr + ranges[i].offset + done, take);
                        if (r < 0)
                                return r;
                        done += take;
                        l->st.bytes += take;
                        progress(l);
                }
        }
        return 0;
}

/* The gathered pieces of chunk k: reads merged where they follow each other in one file, then
 * each piece's copy queued. */
static int issue(Loader *l, int k)
{
        GcuDevicePtr base = (GcuDevicePtr)(uintptr_t)l->b->ptr;
        size_t i = 0;

        while (i < l->n_pieces) {
                const Piece *p = &l->pieces[i];
                size_t j = i + 1, len = p->len;
                int r;

                while (j < l->n_pieces && l->pieces[j].fd == p->fd &&
                       l->pieces[j].file_offset == p->file_offset + len && l->pieces[j].stage == p->stage + len)
                        len += l->pieces[j++].len;
                r = read_full(l, p->fd, p->file_offset, l->chunk[k] + p->stage, len);
                if (r < 0)
                        return r;
                for (; i < j; i++) {
                        const Piece *q = &l->pieces[i];
                        GcuResult cr = CU(cuMemcpyHtoDAsync, base + q->offset, l->chunk[k] + q->stage, q->len,
                                          l->stream);
                        if (cr != GCU_SUCCESS)
                                return cuda_error(l->c, "cuMemcpyHtoDAsync", cr);
                        l->st.bytes += q->len;
                }
        }
        l->n_pieces = 0;
        return 0;
}

/* Waits until chunk k's earlier copies are done, so that it may be written again. */
static int drain(Loader *l, int k)
{
        uint64_t t0;
        GcuResult cr;

        if (!l->busy[k])
                return 0;
        t0 = monotonic_ns();
        cr = CU(cuEventSynchronize, l->done[k]);
        l->st.copy_wait_ns += monotonic_ns() - t0;
        l->busy[k] = false;
        return cr == GCU_SUCCESS ? 0 : cuda_error(l->c, "cuEventSynchronize", cr);
}

static int finish_chunk(Loader *l, int k)
{
        GcuResult cr;
        int r = issue(l, k);

        if (r < 0)
                return r;
        cr = CU(cuEventRecord, l->done[k], l->stream);
        if (cr != GCU_SUCCESS)
                return cuda_error(l->c, "cuEventRecord", cr);
        l->busy[k] = true;
        progress(l);
        return 0;
}

static int load_device_ranges(Loader *l, const gpuipc_file_range_t *ranges, size_t n)
{
        size_t used = 0;
        int k = 0, r;

        for (size_t i = 0; i < n; i++) {
                for (size_t done = 0; done < ranges[i].len;) {
                        size_t room = l->o.chunk_size - used, take = ranges[i].len - done;

                        if (take > room)
                                take = room;
                        if (used == 0 && (r = drain(l, k)) < 0)
                                return r;
                        l->pieces[l->n_pieces++] = (Piece){ ranges[i].fd, ranges[i].file_offset + done, used,
                                                            ranges[i].offset + done, take };
                        used += take;
                        done += take;
                        if (used == l->o.chunk_size) {
                                if ((r = finish_chunk(l, k)) < 0)
                                        return r;
                                k ^= 1;
                                used = 0;
                        } else if (l->n_pieces == LOAD_PIECES && (r = issue(l, k)) < 0) {
                                return r;
                        }
                }
        }
        if (used > 0 && (r = finish_chunk(l, k)) < 0)
                return r;
        return 0;
}

/* In the buffer's device's primary context: the stream, chunks and events, the load, and then
 * (also after a failure: queued copies still read the chunks) the stream drained and all freed. */
static int load_device(Loader *l, const gpuipc_file_range_t *ranges, size_t n)
{
        GcuResult cr;
        int r = 0;

        cr = CU(cuStreamCreate, &l->stream, GCU_STREAM_NON_BLOCKING);
        if (cr != GCU_SUCCESS)
                return cuda_error(l->c, "cuStreamCreate", cr);
        for (int k = 0; k < 2 && r == 0; k++) {
                cr = CU(cuMemAllocHost, (void **)&l->chunk[k], l->o.chunk_size);
                if (cr != GCU_SUCCESS)
                        r = cuda_error(l->c, "cuMemAllocHost", cr);
                else if ((cr = CU(cuEventCreate, &l->done[k], GCU_EVENT_DISABLE_TIMING)) != GCU_SUCCESS)
                        r = cuda_error(l->c, "cuEventCreate", cr);
        }
        if (r == 0)
                r = load_device_ranges(l, ranges, n);
        cr = CU(cuStreamSynchronize, l->stream);
        if (cr != GCU_SUCCESS && r == 0)
                r = cuda_error(l->c, "cuStreamSynchronize", cr);
        for (int k = 0; k < 2; k++) {
                if (l->done[k])
                        CU(cuEventDestroy, l->done[k]);
                if (l->chunk[k])
                        CU(cuMemFreeHost, l->chunk[k]);
        }
        CU(cuStreamDestroy, l->stream);
        return r;
}

_public_ int gpuipc_buffer_load(gpuipc_buffer_t *b, const gpuipc_file_range_t *ranges, size_t n,
                                const gpuipc_load_options_t *opts, gpuipc_load_stats_t *ret_stats)
{
        CLIENT_LOCKED(b ? b->conn : NULL);
        Stream streams[LOAD_STREAMS];
        Loader l = { .c = b ? b->conn : NULL, .b = b, .streams = streams };
        uint64_t t0 = monotonic_ns();
        int r;

        if (!b || !b->ptr || (n && !ranges))
                return GPUIPC_E_INVALID;
        if (opts && client_copy_options(&l.o, sizeof(l.o), opts) < 0) {
                client_errmsg(l.c, "gpuipc_load_options_t.struct_size is 0: set it to sizeof(gpuipc_load_options_t)");
                return GPUIPC_E_INVALID;
        }
        if (!b->own && !b->writable)
                return -EACCES;
        if (b->revoked)
                return GPUIPC_E_REVOKED;
        if (l.o.chunk_size == 0)
                l.o.chunk_size = LOAD_CHUNK_DEFAULT;
        if (l.o.chunk_size < LOAD_CHUNK_MIN)
                l.o.chunk_size = LOAD_CHUNK_MIN;
        for (size_t i = 0; i < n; i++) {
                if (ranges[i].offset > b->size || ranges[i].len > b->size - ranges[i].offset) {
                        client_errmsg(l.c, "range %zu: [%zu, +%zu) lies outside the %zu-byte buffer", i,
                                      ranges[i].offset, ranges[i].len, b->size);
                        return GPUIPC_E_INVALID;
                }
        }
        if (b->kind == GPUIPC_KIND_MEMFD) {
                r = load_host(&l, ranges, n);
        } else {
                r = cuda_ctx_push(l.c, b->ordinal);
                if (r == 0)
                        r = cuda_ctx_pop(l.c, load_device(&l, ranges, n));
        }
        l.st.total_ns = monotonic_ns() - t0;
        if (ret_stats)
                *ret_stats = l.st;
        return r;
}

_public_ int gpuipc_device_memory(gpuipc_t *c, int device, size_t *ret_free, size_t *ret_total)
{
        CLIENT_LOCKED(c);
        size_t free_b = 0, total = 0;
        GcuResult cr;
        int r;

        if (!ret_free || !ret_total)
                return GPUIPC_E_INVALID;
        r = cuda_require(c);
        if (r == 0)
                r = cuda_check_device(c, device);
        if (r == 0)
                r = cuda_ctx_push(c, device);
        if (r < 0)
                return r;
        cr = CU(cuMemGetInfo, &free_b, &total);
        r = cuda_ctx_pop(c, cr == GCU_SUCCESS ? 0 : cuda_error(c, "cuMemGetInfo", cr));
        if (r == 0) {
                *ret_free = free_b;
                *ret_total = total;
        }
        return r;
}
