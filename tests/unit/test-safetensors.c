/* cli/safetensors.c and cli/jsonread.c: a well-formed header is read as written (every dtype of
 * the format, shapes, offsets, __metadata__, escapes in names), and each way a file can be wrong is
 * refused with the byte where it is wrong. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "jsonread.h"
#include "safetensors.h"

/* A file in memory: the length prefix, the JSON, then data_size bytes. */
typedef struct File {
        uint8_t *bytes;
        size_t size;
} File;

static File make(const char *json, size_t data_size)
{
        size_t n = strlen(json);
        File f = { .size = 8 + n + data_size };

        f.bytes = calloc(1, f.size);
        CHECK(f.bytes);
        for (int i = 0; i < 8; i++)
                f.bytes[i] = (uint8_t)((uint64_t)n >> (8 * i));
        memcpy(f.bytes + 8, json, n);
        return f;
}

/* Parses f; returns the result code, the header in *ret (NULL on failure) and the error in err. */
static int parse(File f, SafetensorsHeader **ret, char *err, size_t cap)
{
        uint64_t len;
        int r;

        *ret = NULL;
        err[0] = '\0';
        r = safetensors_header_len(f.bytes, f.size, &len, err, cap);
        if (r == 0)
                r = safetensors_parse((const char *)f.bytes + 8, len, f.size, ret, err, cap);
        free(f.bytes);
        return r;
}

/* The header must be refused, and the message must hold want (a byte offset and a reason). */
static void refused(const char *json, size_t data_size, const char *want)
{
        SafetensorsHeader *h;
        char err[512];
        int r = parse(make(json, data_size), &h, err, sizeof(err));

        CHECKF(r == -EBADMSG, "accepted (%d): %s", r, json);
        CHECK(h == NULL);
        CHECKF(strstr(err, want) != NULL, "'%s' does not say '%s' for %s", err, want, json);
        CHECKF(strncmp(err, "byte ", 5) == 0, "'%s' names no byte", err);
}

/* Every dtype, with its size, in one file. */
static void test_every_dtype(void)
{
        static const struct { const char *name; unsigned bits; } all[] = {
                { "BOOL", 8 }, { "U8", 8 }, { "I8", 8 }, { "I16", 16 }, { "U16", 16 }, { "I32", 32 },
                { "U32", 32 }, { "I64", 64 }, { "U64", 64 }, { "F16", 16 }, { "BF16", 16 }, { "F32", 32 },
                { "F64", 64 }, { "C64", 64 }, { "F8_E4M3", 8 }, { "F8_E5M2", 8 }, { "F8_E8M0", 8 },
                { "F4", 4 }, { "F6_E2M3", 6 }, { "F6_E3M2", 6 },
        };
        char json[8192], *p = json;
        uint64_t off = 0;
        SafetensorsHeader *h;
        char err[512];
        size_t n = sizeof(all) / sizeof(all[0]);

        p += sprintf(p, "{\"__metadata__\":{\"format\":\"pt\"}");
        for (size_t i = 0; i < n; i++) {
                /* 4 x 8 elements: whole bytes for every dtype, F6's included (48 bits a row of 8) */
                uint64_t bytes = 32 * all[i].bits / 8;
                p += sprintf(p, ",\"t%zu\":{\"dtype\":\"%s\",\"shape\":[4,8],\"data_offsets\":[%llu,%llu]}", i,
                             all[i].name, (unsigned long long)off, (unsigned long long)(off + bytes));
                off += bytes;
        }
        strcpy(p, "}");
        CHECK_EQ(parse(make(json, off), &h, err, sizeof(err)), 0);
        CHECK_EQ(h->n, n);
        CHECK_EQ(h->data_start, 8 + strlen(json));
        for (size_t i = 0; i < n; i++) {
                CHECK_STREQ(safetensors_dtype_name(h->tensors[i].dtype), all[i].name);
                CHECK_EQ(safetensors_dtype_bits(h->tensors[i].dtype), all[i].bits);
                CHECK_EQ(h->tensors[i].ndim, 2);
                CHECK_EQ(h->tensors[i].shape[0], 4);
                CHECK_EQ(h->tensors[i].end - h->tensors[i].begin, 32 * all[i].bits / 8);
        }
        safetensors_header_free(h);
}

/* Names with escapes, a scalar, an empty tensor, white space after the object (writers pad). */
static void test_names_and_shapes(void)
{
        SafetensorsHeader *h;
        char err[512];
        const char *json = "{ \"a\\u00e9\\ud83d\\ude00\\n\" : {\"shape\":[],\"data_offsets\":[0,4],\"dtype\":\"F32\"},"
                           "\"empty\":{\"dtype\":\"BF16\",\"shape\":[0,7],\"data_offsets\":[4,4]}}    ";

        CHECK_EQ(parse(make(json, 4), &h, err, sizeof(err)), 0);
        CHECK_EQ(h->n, 2);
        CHECK_STREQ(h->tensors[0].name, "a\xc3\xa9\xf0\x9f\x98\x80\n");
        CHECK_EQ(h->tensors[0].ndim, 0);
        CHECK_EQ(h->tensors[1].shape[1], 7);
        safetensors_header_free(h);
}

static void test_bad_length(void)
{
        SafetensorsHeader *h;
        char err[512];
        File f = make("{}", 0);

        /* past the file */
        f.bytes[0] = 200;
        CHECK_EQ(parse(f, &h, err, sizeof(err)), -EBADMSG);
        CHECK(strstr(err, "byte 0: the header length 200 goes past the end"));
        /* past the format's limit, in a file that would hold it */
        f = make("{}", 0);
        f.bytes[3] = 0x10; /* 256 MiB */
        CHECK_EQ(parse(f, &h, err, sizeof(err)), -EBADMSG);
        CHECK(strstr(err, "over the format's limit"));
        /* the whole 2^64 range */
        f = make("{}", 0);
        memset(f.bytes, 0xff, 8);
        CHECK_EQ(parse(f, &h, err, sizeof(err)), -EBADMSG);
        CHECK(strstr(err, "byte 0:"));
}

static void test_malformed(void)
{
        /* not JSON, or not the format's JSON */
        refused("[]", 0, "byte 8: expected '{'");
        refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}", 4, "ends too early");
        refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},}", 4, "expected a string");
        refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}} x", 4, "follows");
        refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}{}", 4, "follows");
        refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":1}}", 4, "unknown key 'x'");
        refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, "tensor 'a': no data_offsets");
        refused("{\"a\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
                "'dtype' twice");
        refused("{\"a\":{\"dtype\":\"F12\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "unknown dtype 'F12'");
        refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, "not an unsigned integer");
        refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1.0],\"data_offsets\":[0,4]}}", 4, "not an unsigned integer");
        refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[01],\"data_offsets\":[0,4]}}", 4, "not an unsigned integer");
        refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[18446744073709551616],\"data_offsets\":[0,4]}}", 4,
                "not an unsigned integer");
        refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 4, "needs two numbers");
        refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", 8, "more than two");
        refused("{\"a\\u0000\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "U+0000");
        refused("{\"a\\ud800\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "surrogate");
        refused("{\"a\xff\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "not valid UTF-8");
        refused("{\"a\xc0\xaf\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "not valid UTF-8");
        refused("{\"a\tb\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "control character");
        refused("{\"__metadata__\":{\"a\":1}}", 0, "not a string");
        refused("{\"__metadata__\":[]}", 0, "not an object");
        refused("{\"__metadata__\":{},\"__metadata__\":{}}", 0, "__metadata__ twice");
        /* the byte is where the fault is: 8 + its offset in the JSON */
        refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[x],\"data_offsets\":[0,4]}}", 4, "byte 37:");
}

static void test_bad_layout(void)
{
        /* offsets past the data, reversed, overlapping; sizes that do not match */
        refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4, "go past the data's 4 bytes");
        refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}}", 4, "ends before it begins");
        refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "overlap");
        refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "overlap");
        refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, "make 12 bytes");
        refused("{\"a\":{\"dtype\":\"F4\",\"shape\":[3],\"data_offsets\":[0,1]}}", 4, "do not fill whole bytes");
        refused("{\"a\":{\"dtype\":\"F64\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,8]}}", 8, "overflows");
        refused("{\"a\":{\"dtype\":\"F64\",\"shape\":[2305843009213693952],\"data_offsets\":[0,8]}}", 8, "overflows");
        refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "'a' appears twice");
}

/* Nesting past the limit inside __metadata__'s skipped values, and 33 dimensions. */
static void test_limits(void)
{
        char json[512], *p = json;

        p += sprintf(p, "{\"a\":{\"dtype\":\"U8\",\"shape\":[");
        for (int i = 0; i < 33; i++)
                p += sprintf(p, "%s1", i ? "," : "");
        sprintf(p, "],\"data_offsets\":[0,1]}}");
        refused(json, 1, "more than 32 dimensions");
}

/* The skipper walks any JSON value and stops at the depth limit. */
static void test_skip(void)
{
        JsonRead r;
        char deep[200];
        const char *ok = "{\"a\":[1,-2.5e3,true,false,null,\"x\\\"\",{\"b\":[]}],\"c\":{}} ";

        jsonread_init(&r, ok, strlen(ok));
        CHECK(jsonread_skip(&r));
        CHECK(jsonread_at_end(&r));
        memset(deep, '[', 65);
        memset(deep + 65, ']', 65);
        jsonread_init(&r, deep, 130);
        CHECK(!jsonread_skip(&r));
        CHECK_STREQ(r.err, "nested too deep");
        jsonread_init(&r, deep, 128); /* 64 deep: fine */
        memmove(deep, deep + 1, 128);
        jsonread_init(&r, deep, 128);
        CHECK(jsonread_skip(&r));
        jsonread_init(&r, "[1,]", 4);
        CHECK(!jsonread_skip(&r));
        jsonread_init(&r, "-", 1);
        CHECK(!jsonread_skip(&r));
        jsonread_init(&r, "1.", 2);
        CHECK(!jsonread_skip(&r));
}

int main(void)
{
        test_every_dtype();
        test_names_and_shapes();
        test_bad_length();
        test_malformed();
        test_bad_layout();
        test_limits();
        test_skip();
        return 0;
}
