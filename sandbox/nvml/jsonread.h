/*
 * A minimal JSON reader for the sandbox's stand-in GPU libraries (nvml.c, amdsmi/amdsmi.c):
 * strings (with escapes, into fixed buffers), integers, literals, and skipping any value.
 * Static functions only: each library includes its own copy.
 */
#ifndef SANDBOX_JSONREAD_H
#define SANDBOX_JSONREAD_H

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *p;
    const char *end;
    int failed;
} reader_t;

static void skip_ws(reader_t *r) {
    while (r->p < r->end && (*r->p == ' ' || *r->p == '\t' || *r->p == '\n' || *r->p == '\r'))
        r->p++;
}

static int expect(reader_t *r, char c) {
    skip_ws(r);
    if (r->p < r->end && *r->p == c) {
        r->p++;
        return 1;
    }
    r->failed = 1;
    return 0;
}

static int peek(reader_t *r, char c) {
    skip_ws(r);
    return r->p < r->end && *r->p == c;
}

static int hex4(reader_t *r, unsigned *out) {
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        if (r->p >= r->end || !isxdigit((unsigned char)*r->p)) return 0;
        char c = *r->p++;
        v = v * 16 + (unsigned)(isdigit((unsigned char)c) ? c - '0' : (tolower(c) - 'a' + 10));
    }
    *out = v;
    return 1;
}

/* Reads a JSON string into buf (UTF-8, NUL-terminated). buf may be NULL to skip.
 * Fails (r->failed) when the value does not fit in cap bytes. */
static void read_string(reader_t *r, char *buf, size_t cap) {
    size_t n = 0;
    if (!expect(r, '"')) return;
    while (r->p < r->end && *r->p != '"') {
        unsigned cp;
        char c = *r->p++;
        if ((unsigned char)c < 0x20) { r->failed = 1; return; }
        if (c != '\\') {
            if (buf) {
                if (n + 1 >= cap) { r->failed = 1; return; }
                buf[n++] = c;
            }
            continue;
        }
        if (r->p >= r->end) { r->failed = 1; return; }
        c = *r->p++;
        switch (c) {
        case '"': cp = '"'; break;
        case '\\': cp = '\\'; break;
        case '/': cp = '/'; break;
        case 'b': cp = '\b'; break;
        case 'f': cp = '\f'; break;
        case 'n': cp = '\n'; break;
        case 'r': cp = '\r'; break;
        case 't': cp = '\t'; break;
        case 'u':
            if (!hex4(r, &cp)) { r->failed = 1; return; }
            if (cp >= 0xD800 && cp <= 0xDBFF) {  /* surrogate pair */
                unsigned lo;
                if (r->end - r->p < 6 || r->p[0] != '\\' || r->p[1] != 'u') { r->failed = 1; return; }
                r->p += 2;
                if (!hex4(r, &lo) || lo < 0xDC00 || lo > 0xDFFF) { r->failed = 1; return; }
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            }
            break;
        default: r->failed = 1; return;
        }
        if (buf) {
            char enc[4];
            size_t k;
            if (cp < 0x80) { enc[0] = (char)cp; k = 1; }
            else if (cp < 0x800) { enc[0] = (char)(0xC0 | (cp >> 6)); enc[1] = (char)(0x80 | (cp & 0x3F)); k = 2; }
            else if (cp < 0x10000) {
                enc[0] = (char)(0xE0 | (cp >> 12)); enc[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
                enc[2] = (char)(0x80 | (cp & 0x3F)); k = 3;
            } else {
                enc[0] = (char)(0xF0 | (cp >> 18)); enc[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
                enc[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); enc[3] = (char)(0x80 | (cp & 0x3F)); k = 4;
            }
            if (n + k >= cap) { r->failed = 1; return; }
            memcpy(buf + n, enc, k);
            n += k;
        }
    }
    if (!expect(r, '"')) return;
    if (buf) buf[n] = '\0';
}

/* Reads a JSON number; integers only are meaningful to us, so a fraction or exponent fails. */
static long long read_int(reader_t *r) {
    char tmp[32];
    size_t n = 0;
    skip_ws(r);
    while (r->p < r->end && n + 1 < sizeof tmp &&
           (isdigit((unsigned char)*r->p) || *r->p == '-' || *r->p == '+' || *r->p == '.' ||
            *r->p == 'e' || *r->p == 'E'))
        tmp[n++] = *r->p++;
    tmp[n] = '\0';
    if (n == 0) { r->failed = 1; return 0; }
    errno = 0;
    char *stop;
    long long v = strtoll(tmp, &stop, 10);
    if (*stop != '\0' || errno) r->failed = 1;
    return v;
}

static int read_literal(reader_t *r, const char *word) {
    size_t n = strlen(word);
    skip_ws(r);
    if ((size_t)(r->end - r->p) >= n && memcmp(r->p, word, n) == 0) {
        r->p += n;
        return 1;
    }
    return 0;
}

static void skip_value(reader_t *r, int depth);

static void skip_number(reader_t *r) {
    skip_ws(r);
    const char *start = r->p;
    while (r->p < r->end && (isdigit((unsigned char)*r->p) || *r->p == '-' || *r->p == '+' ||
                             *r->p == '.' || *r->p == 'e' || *r->p == 'E'))
        r->p++;
    if (r->p == start) r->failed = 1;
}

static void skip_value(reader_t *r, int depth) {
    if (depth > 64) { r->failed = 1; return; }
    skip_ws(r);
    if (r->p >= r->end) { r->failed = 1; return; }
    switch (*r->p) {
    case '"': read_string(r, NULL, 0); return;
    case '{':
        r->p++;
        if (peek(r, '}')) { r->p++; return; }
        while (!r->failed) {
            read_string(r, NULL, 0);
            expect(r, ':');
            skip_value(r, depth + 1);
            if (peek(r, ',')) { r->p++; continue; }
            expect(r, '}');
            return;
        }
        return;
    case '[':
        r->p++;
        if (peek(r, ']')) { r->p++; return; }
        while (!r->failed) {
            skip_value(r, depth + 1);
            if (peek(r, ',')) { r->p++; continue; }
            expect(r, ']');
            return;
        }
        return;
    default:
        if (read_literal(r, "true") || read_literal(r, "false") || read_literal(r, "null")) return;
        skip_number(r);
    }
}

/* The whole file at path, malloc'd (the caller frees it), or NULL when it cannot be read or
 * is over 4 MiB. */
static char *read_whole_file(const char *path, size_t *len_out) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *text = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len + 4096 > cap) {
            cap = cap ? cap * 2 : 8192;
            if (cap > (1u << 22)) { free(text); fclose(f); return NULL; }  /* 4 MiB is plenty */
            char *grown = realloc(text, cap);
            if (!grown) { free(text); fclose(f); return NULL; }
            text = grown;
        }
        size_t got = fread(text + len, 1, cap - len, f);
        len += got;
        if (got == 0) break;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) { free(text); return NULL; }
    *len_out = len;
    return text;
}

/* The members of a JSON object, in order: `member` reads the value of each key it knows and
 * answers 1, or answers 0 to have the value skipped. Keys longer than 63 bytes fail the parse. */
typedef int (*member_fn)(reader_t *r, const char *key, void *ctx);

static void read_object(reader_t *r, member_fn member, void *ctx) {
    char key[64];
    if (!expect(r, '{')) return;
    if (peek(r, '}')) { r->p++; return; }
    while (!r->failed) {
        read_string(r, key, sizeof key);
        expect(r, ':');
        if (r->failed) return;
        if (!member(r, key, ctx)) skip_value(r, 1);
        if (peek(r, ',')) { r->p++; continue; }
        expect(r, '}');
        return;
    }
}

/* The items of a JSON array, each read by `item` into the next of `cap` slots of `size` bytes
 * from `first`, counted in *count; more than `cap` fail the parse. */
typedef void (*item_fn)(reader_t *r, void *slot);

static void read_array(reader_t *r, item_fn item, void *first, size_t size, unsigned cap,
                       unsigned *count) {
    if (!expect(r, '[')) return;
    if (peek(r, ']')) { r->p++; return; }
    while (!r->failed) {
        if (*count >= cap) { r->failed = 1; return; }
        item(r, (char *)first + (size_t)(*count)++ * size);
        if (peek(r, ',')) { r->p++; continue; }
        expect(r, ']');
        return;
    }
}

/* A whole document: one object and nothing after it; 1 when it parsed. */
static int read_document(const char *text, size_t len, member_fn member, void *ctx) {
    reader_t r = {text, text + len, 0};
    read_object(&r, member, ctx);
    skip_ws(&r);
    if (r.p != r.end) r.failed = 1;
    return !r.failed;
}

#endif
