/* Tables for people: every row is kept until the table is printed, so that each column is exactly
 * as wide as its widest cell (ids of 16 digits and long names never push a row out of line). */
#pragma once

#include <stdio.h>

typedef struct Table Table;

/* A table with these headers; align has one letter per column, 'l' or 'r'. NULL without memory. */
Table *table_new(const char *const *headers, const char *align);
Table *table_free(Table *t);

/* The next cell, left to right, row after row. The text is made safe for a terminal (text.h): any
 * peer may have chosen it. */
void table_cell(Table *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* How many complete rows the table holds. */
size_t table_rows(const Table *t);

/* Header and rows, columns separated by one space, no trailing blanks. 0, or -ENOMEM when a cell
 * could not be kept (nothing is printed then). */
int table_print(Table *t, FILE *f);
