/* The safetensors format, read with bounds: an 8-byte little-endian header length, a JSON header
 * ({"__metadata__": {str: str}, NAME: {"dtype", "shape", "data_offsets"}, ...}), then the data,
 * each tensor's bytes at [begin, end) from the data's start. Pure: the caller reads the bytes, this
 * checks them and says what they describe. Everything a hostile file could make wrong is refused
 * with the byte offset in the file where it is wrong: a header length past the file or past
 * SAFETENSORS_MAX_HEADER (safetensors' own limit), JSON that is not, an unknown dtype, a shape whose
 * size overflows or does not match its byte range, a range past the data, two ranges that overlap,
 * a name twice. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#define SAFETENSORS_MAX_HEADER 100000000u /* as the safetensors library: 100 MB */
#define SAFETENSORS_MAX_NDIM 32           /* what NumPy 1.x and the Python package take */
#define SAFETENSORS_MAX_NAME 4096         /* bytes of a tensor's name */

/* Every dtype of the safetensors format (its Dtype enum, as of safetensors 0.6). */
typedef enum SafetensorsDtype {
        ST_BOOL, ST_U8, ST_I8, ST_I16, ST_U16, ST_I32, ST_U32, ST_I64, ST_U64,
        ST_F16, ST_BF16, ST_F32, ST_F64, ST_C64,
        ST_F8_E4M3, ST_F8_E5M2, ST_F8_E8M0,
        ST_F4, ST_F6_E2M3, ST_F6_E3M2,
        ST_N_DTYPES
} SafetensorsDtype;

typedef struct SafetensorsTensor {
        char *name;
        SafetensorsDtype dtype;
        uint32_t ndim;
        uint64_t shape[SAFETENSORS_MAX_NDIM];
        uint64_t begin, end; /* from the data's start */
} SafetensorsTensor;

typedef struct SafetensorsHeader {
        uint64_t data_start;  /* 8 + the header's length: where the data starts in the file */
        uint64_t data_size;   /* the file's size - data_start */
        size_t n;
        SafetensorsTensor *tensors; /* in the header's order */
} SafetensorsHeader;

/* The format's name of a dtype ("BF16"), and its size in bits (4 for F4). */
const char *safetensors_dtype_name(SafetensorsDtype d);
unsigned safetensors_dtype_bits(SafetensorsDtype d);

/* The header's length from the file's first 8 bytes, checked against the file's size and
 * SAFETENSORS_MAX_HEADER. 0, or -EBADMSG with err saying why. */
int safetensors_header_len(const uint8_t first8[8], uint64_t file_size, uint64_t *ret, char *err, size_t cap);

/* Parses the header's JSON (len bytes, as safetensors_header_len gave) of a file of file_size
 * bytes. 0 and *ret (free it with safetensors_header_free), -ENOMEM, or -EBADMSG with err saying
 * what is wrong and at which byte of the file. */
int safetensors_parse(const char *json, size_t len, uint64_t file_size, SafetensorsHeader **ret, char *err, size_t cap);

SafetensorsHeader *safetensors_header_free(SafetensorsHeader *h);
