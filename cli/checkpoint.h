/* A safetensors checkpoint as `gpuipcctl weights load` places it in one buffer: its files (one, several,
 * or the shards a model.safetensors.index.json names), every tensor's header checked, and the layout
 * the Python package's attach_state_dict() reads (python/gpuipc/state_dict.py): each tensor at an
 * offset aligned to 256 bytes, in file order, then the manifest, a msgpack map
 * {'format': 'gpuipc.state_dict/1', 'entries': [[key, dtype, shape, offset], ...]}. Nothing is read
 * but headers: the data goes straight into the buffer (gpuipc_buffer_load). */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpuipc.h"
#include "safetensors.h"

#define CHECKPOINT_ALIGN 256
#define CHECKPOINT_FORMAT "gpuipc.state_dict/1"
#define CHECKPOINT_MAX_INDEX (64u << 20) /* bytes of a model.safetensors.index.json */
#define CHECKPOINT_MAX_FILES 4096

typedef struct CheckpointFile {
        char *path;
        int fd;
        bool pipe;      /* cannot seek (a FIFO, "-"): read once, in order */
        uint64_t size;  /* UINT64_MAX for a pipe */
        SafetensorsHeader *h;
} CheckpointFile;

typedef struct CheckpointTensor {
        const SafetensorsTensor *t;
        size_t file;
        const char *dtype;     /* the Python package's name: "bfloat16", "float8_e4m3fn", ... */
        uint32_t ndim;
        uint64_t shape[SAFETENSORS_MAX_NDIM]; /* as the framework sees it (F4: two per byte) */
        uint64_t offset;       /* in the buffer */
} CheckpointTensor;

typedef struct Checkpoint {
        CheckpointFile *files;
        size_t n_files;
        CheckpointTensor *tensors; /* file by file, each file's in file order */
        size_t n;
        uint64_t data_bytes;       /* the tensors' bytes, without alignment */
        uint64_t manifest_offset;
        uint8_t *manifest;
        size_t manifest_len;
        uint64_t size;             /* the buffer: tensors, padding, manifest */
} Checkpoint;

/* Opens and checks paths: safetensors files, or one *.json index whose shards are read from its
 * directory. 0 and *ret, -ENOMEM, or -EBADMSG / -errno with err naming the file and what is wrong
 * (for a header: at which byte). Nothing but headers is read. */
int checkpoint_open(char *const *paths, size_t n, Checkpoint **ret, char *err, size_t cap);

/* The ranges of every tensor, for gpuipc_buffer_load, into a new array of c->n (NULL: no memory).
 * A pipe's reader must stand at its first range (checkpoint_open leaves it there). */
gpuipc_file_range_t *checkpoint_ranges(const Checkpoint *c);

/* Closes the files and frees c. NULL is fine. */
Checkpoint *checkpoint_free(Checkpoint *c);

/* The metadata map for the publish, msgpack: {'state_dict': {'version': 1, 'manifest': [offset, len]},
 * 'weights': {'files': N, 'tensors': N, 'bytes': N}} into buf (at most cap bytes). Its length, or 0 if
 * it does not fit. */
size_t checkpoint_meta(const Checkpoint *c, uint8_t *buf, size_t cap);
