/* The memfd kind: host memory in a sealed memfd. The producer keeps a read-write mapping; what
 * travels is the fd itself, and each consumer maps it read-only or read-write as published. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"
#include "macro.h"
#include "seals.h"

static int memfd_alloc(gpuipc_t *c, gpuipc_buffer_t *b, size_t size, int device)
{
        _cleanup_close_ int fd = -1;
        void *p;

        (void)device;
        /* ALLOW_SEALING: sealing happens at the first publish (memfd_export), and the broker
         * refuses a memfd without the seals; a memfd made without it could never get them. */
        fd = memfd_create("gpuipc", MFD_CLOEXEC | MFD_ALLOW_SEALING);
        if (fd < 0)
                return -errno;
        /* Sized before mapping and sealing: F_SEAL_GROW comes later, and the mapping must not
         * reach past the file's end (SIGBUS on touch). */
        if (ftruncate(fd, (off_t)size) < 0)
                return -errno;
        p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED) {
                client_errmsg(c, "cannot map %zu bytes of host memory: %s", size, strerror(errno));
                return -errno;
        }
        b->ptr = p;
        b->size = size;
        b->ka.fd = steal_fd(fd);
        return 0;
}

/* Seals once, at the first publish: the size can never change under a consumer's mapping, and a
 * read-only buffer can never be mapped writable again, not even by reopening it through /proc
 * (our own mapping, made before the seal, stays writable). */
static int memfd_export(gpuipc_t *c, gpuipc_buffer_t *b, bool writable, int *ret_fd)
{
        int seals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;

        if (!b->ka.sealed) {
                if (!writable)
                        seals |= F_SEAL_FUTURE_WRITE;
                if (fcntl(b->ka.fd, F_ADD_SEALS, seals) < 0) {
                        client_errmsg(c, "cannot seal the memfd: %s", strerror(errno));
                        return -errno;
                }
                b->ka.sealed = true;
        }
        /* Lent, not duplicated: the caller sends it and the buffer keeps owning it. */
        *ret_fd = b->ka.fd;
        return 0;
}

static void memfd_free(gpuipc_t *c, gpuipc_buffer_t *b)
{
        (void)c;
        if (b->ptr)
                munmap(b->ptr, b->size);
        b->ka.fd = safe_close(b->ka.fd);
        b->ptr = NULL;
}

static int memfd_import(gpuipc_t *c, Mapping *m, const ProtoMsg *reply, int fd)
{
        _cleanup_close_ int owned = fd;
        struct stat st;
        void *p;

        (void)reply;
        if (owned < 0) {
                client_errmsg(c, "the broker attached a memfd buffer without its fd");
                return GPUIPC_E_BAD_REPLY;
        }
        /* Never map beyond the file: touching that would raise SIGBUS. */
        if (fstat(owned, &st) < 0 || (uint64_t)st.st_size < m->size) {
                client_errmsg(c, "the memfd is smaller than the buffer's announced size");
                return GPUIPC_E_BAD_REPLY;
        }
        p = mmap(NULL, m->size, PROT_READ | (m->writable ? PROT_WRITE : 0), MAP_SHARED, owned, 0);
        if (p == MAP_FAILED) {
                client_errmsg(c, "cannot map the buffer: %s", strerror(errno));
                return -errno;
        }
        m->ptr = p;
        return 0;
}

static void memfd_unmap(gpuipc_t *c, Mapping *m)
{
        (void)c;
        if (m->ptr)
                munmap(m->ptr, m->size);
        m->ptr = NULL;
}

/* Host memory both ways: gpuipc_buffer_read/write work on every kind through one path, and for
 * memfd that path is a memcpy. */
static int memfd_copy(void *ptr, int ordinal, void *host, size_t len, bool to_host)
{
        (void)ordinal;
        if (to_host)
                memcpy(host, ptr, len);
        else
                memcpy(ptr, host, len);
        return 0;
}

const KindOps kind_memfd_ops = {
        .alloc = memfd_alloc,
        .export = memfd_export,
        .sync = NULL,
        .free = memfd_free,
        .import = memfd_import,
        .unmap = memfd_unmap,
        .copy = memfd_copy,
};
