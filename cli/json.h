/* Minimal JSON writing for --json output: objects of strings, numbers and booleans. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

typedef struct Json {
        FILE *f;
        bool first; /* no comma before the next member or element */
} Json;

void json_begin(Json *j, FILE *f, char open);   /* '{' or '[' */
void json_end(Json *j, char close);             /* '}' or ']' */
void json_key(Json *j, const char *key);        /* then a value */
void json_str(Json *j, const char *s, size_t len);
void json_u64(Json *j, uint64_t v);
void json_bool(Json *j, bool v);
void json_next(Json *j);                        /* separates array elements */
