/*
 * sluice.c: the C SDK's implementation (see sluice.h for the API).
 *
 * It implements the exports that `wit-bindgen c --world packed-out`
 * declares in packed_out.h (`exports_packed_out_init`, `_process`,
 * `_process_packed`, `_process_packed_out`, `_on_timers`, `_migrate`,
 * `_hold_state`, `_flush_state`) on top of the user's hooks, and owns the
 * state cache (one call's, or a shard's held across calls). A host of 0.1.5 or later hands batches to
 * `process-packed-out` as one byte string, which the SDK reads in place
 * (`unpack_batch`), and takes the outputs back as one byte string, which
 * the emitter writes as records are emitted; the cache talks to the host
 * with `get-many-packed` and `write-packed`: no allocation per record or
 * per key crosses the boundary. Ownership follows the generated bindings:
 * export arguments belong to us and are freed before returning; returned
 * outputs are freed by the generated post-return function, so they are
 * malloc'd (and, in a list of records, nothing of length 0 is). The
 * cache's keys and the values it read live in one bump allocation per call
 * (`cache_bytes`). Anything
 * handed to the user that outlives one SDK call (fired windows) is kept in a
 * per-call arena freed when the export returns.
 */
#include "sluice.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

/* ---- memory ------------------------------------------------------------ */

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) abort(); /* out of memory: the only abort */
    return p;
}

static void *xrealloc(void *p, size_t n) {
    p = realloc(p, n ? n : 1);
    if (!p) abort();
    return p;
}

/* A malloc'd copy of `ptr`, or NULL when it is empty (the generated
 * post-return code frees only non-empty lists). */
static uint8_t *copy_bytes(const uint8_t *ptr, size_t len) {
    if (len == 0) return NULL;
    uint8_t *p = xmalloc(len);
    memcpy(p, ptr, len);
    return p;
}

/* What the current export call has handed out and frees when it returns. */
static void **arena;
static size_t arena_len, arena_cap;

static void *arena_keep(void *p) {
    if (arena_len == arena_cap) {
        arena_cap = arena_cap ? arena_cap * 2 : 16;
        arena = xrealloc(arena, arena_cap * sizeof *arena);
    }
    arena[arena_len++] = p;
    return p;
}

static void arena_free(void) {
    for (size_t i = 0; i < arena_len; i++) free(arena[i]);
    arena_len = 0;
}

/* ---- buffers ----------------------------------------------------------- */

static void buf_reserve(sluice_buf_t *b, size_t extra) {
    if (b->len + extra <= b->cap) return;
    size_t cap = b->cap ? b->cap : 32;
    while (cap < b->len + extra) cap *= 2;
    b->ptr = xrealloc(b->ptr, cap);
    b->cap = cap;
}

void sluice_buf_append(sluice_buf_t *b, const void *data, size_t len) {
    if (!len) return;
    buf_reserve(b, len);
    memcpy(b->ptr + b->len, data, len);
    b->len += len;
}

void sluice_buf_append_str(sluice_buf_t *b, const char *s) { sluice_buf_append(b, s, strlen(s)); }

static void buf_byte(sluice_buf_t *b, uint8_t c) { sluice_buf_append(b, &c, 1); }

static void buf_vprintf(sluice_buf_t *b, const char *fmt, va_list args) {
    va_list copy;
    va_copy(copy, args);
    int n = vsnprintf(NULL, 0, fmt, copy);
    va_end(copy);
    if (n <= 0) return;
    buf_reserve(b, (size_t)n + 1);
    vsnprintf((char *)b->ptr + b->len, (size_t)n + 1, fmt, args);
    b->len += (size_t)n;
}

void sluice_buf_printf(sluice_buf_t *b, const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    buf_vprintf(b, fmt, args);
    va_end(args);
}

void sluice_buf_clear(sluice_buf_t *b) { b->len = 0; }

void sluice_buf_free(sluice_buf_t *b) {
    free(b->ptr);
    b->ptr = NULL;
    b->len = b->cap = 0;
}

/* ---- packed byte strings ------------------------------------------------ */

/* The little-endian layouts of wit/sluice.wit's `packed-batch`,
 * `get-many-packed` and `write-packed`: one byte string instead of a list
 * whose every element the canonical ABI allocates for. */

static void buf_u32(sluice_buf_t *b, uint32_t v) {
    uint8_t le[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    sluice_buf_append(b, le, sizeof le);
}

/* Writes `count` over the u32 placeholder at the start of `b`. */
static void buf_patch_count(sluice_buf_t *b, uint32_t count) {
    for (int i = 0; i < 4; i++) b->ptr[i] = (uint8_t)(count >> (8 * i));
}

/* A reader over a packed string the host sent. Reading past its end sets
 * `bad` and yields zeros, so a caller checks once at the end. */
typedef struct unpacker {
    const uint8_t *at, *end;
    bool bad;
} unpacker_t;

static const uint8_t *un_take(unpacker_t *u, size_t n) {
    if (u->bad || (size_t)(u->end - u->at) < n) {
        u->bad = true;
        return NULL;
    }
    const uint8_t *p = u->at;
    u->at += n;
    return p;
}

static uint8_t un_u8(unpacker_t *u) {
    const uint8_t *p = un_take(u, 1);
    return p ? p[0] : 0;
}

static uint32_t un_u32(unpacker_t *u) {
    const uint8_t *p = un_take(u, 4);
    return p ? (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24 : 0;
}

static int64_t un_s64(unpacker_t *u) {
    const uint8_t *p = un_take(u, 8);
    uint64_t v = 0;
    for (int i = 7; p && i >= 0; i--) v = v << 8 | p[i];
    return (int64_t)v;
}

/* A u32 length, then that many bytes (a view into the packed string). */
static packed_out_list_u8_t un_bytes(unpacker_t *u) {
    uint32_t len = un_u32(u);
    const uint8_t *p = un_take(u, len);
    packed_out_list_u8_t b = {p ? (uint8_t *)p : NULL, p ? len : 0};
    return b;
}

/* ---- errors ------------------------------------------------------------ */

static char *error_message; /* malloc'd; NULL when there is none */

int sluice_error(const char *fmt, ...) {
    sluice_buf_t b = {0};
    va_list args;
    va_start(args, fmt);
    buf_vprintf(&b, fmt, args);
    va_end(args);
    buf_byte(&b, 0);
    free(error_message);
    error_message = (char *)b.ptr;
    return SLUICE_ERR;
}

const char *sluice_last_error(void) { return error_message; }

/* Moves the current error, prefixed with `prefix`, into `out` (a WIT string
 * that the generated code frees after returning it). */
static void take_error(packed_out_string_t *out, const char *prefix, size_t prefix_len) {
    const char *msg = error_message ? error_message : "failed (the hook returned an error without a message)";
    size_t mlen = strlen(msg);
    uint8_t *buf = xmalloc(prefix_len + mlen + 1);
    memcpy(buf, prefix, prefix_len);
    memcpy(buf + prefix_len, msg, mlen);
    out->ptr = buf;
    out->len = prefix_len + mlen;
    free(error_message);
    error_message = NULL;
}

/* ---- saturating arithmetic (as Rust's, which the layouts are defined in) */

static int64_t sat_add(int64_t a, int64_t b) {
    int64_t r;
    if (__builtin_add_overflow(a, b, &r)) return b > 0 ? INT64_MAX : INT64_MIN;
    return r;
}

static int64_t sat_sub(int64_t a, int64_t b) {
    int64_t r;
    if (__builtin_sub_overflow(a, b, &r)) return b < 0 ? INT64_MAX : INT64_MIN;
    return r;
}

static int64_t sat_mul(int64_t a, int64_t b) {
    int64_t r;
    if (__builtin_mul_overflow(a, b, &r)) return (a < 0) != (b < 0) ? INT64_MIN : INT64_MAX;
    return r;
}

/* a.div_euclid(b) for b > 0. */
static int64_t floor_div(int64_t a, int64_t b) {
    int64_t q = a / b;
    if (a % b != 0 && a < 0) q--;
    return q;
}

/* ---- JSON -------------------------------------------------------------- */

typedef struct jcur {
    const uint8_t *p;
    size_t n, i;
} jcur_t;

static bool json_space(uint8_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static void j_ws(jcur_t *c) {
    while (c->i < c->n && json_space(c->p[c->i])) c->i++;
}

static bool j_lit(jcur_t *c, const char *lit) {
    size_t n = strlen(lit);
    if (c->n - c->i < n || memcmp(c->p + c->i, lit, n) != 0) return false;
    c->i += n;
    return true;
}

static bool is_hex(uint8_t c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

/* A string starting at '"'; *content and *content_len (may be NULL) get the
 * raw text between the quotes. */
static bool j_string(jcur_t *c, const uint8_t **content, size_t *content_len) {
    if (c->i >= c->n || c->p[c->i] != '"') return false;
    size_t start = ++c->i;
    while (c->i < c->n) {
        uint8_t ch = c->p[c->i];
        if (ch == '"') {
            if (content) *content = c->p + start;
            if (content_len) *content_len = c->i - start;
            c->i++;
            return true;
        }
        if (ch < 0x20) return false;
        if (ch == '\\') {
            if (++c->i >= c->n) return false;
            uint8_t e = c->p[c->i];
            if (e == 'u') {
                if (c->n - c->i < 5) return false;
                for (int k = 1; k <= 4; k++)
                    if (!is_hex(c->p[c->i + k])) return false;
                c->i += 4;
            } else if (!strchr("\"\\/bfnrt", e) || e == 0) {
                return false;
            }
        }
        c->i++;
    }
    return false;
}

static bool is_digit(uint8_t c) { return c >= '0' && c <= '9'; }

static bool j_number(jcur_t *c) {
    size_t i = c->i, n = c->n;
    if (i < n && c->p[i] == '-') i++;
    if (i >= n || !is_digit(c->p[i])) return false;
    if (c->p[i] == '0') {
        i++;
    } else {
        while (i < n && is_digit(c->p[i])) i++;
    }
    if (i < n && c->p[i] == '.') {
        i++;
        if (i >= n || !is_digit(c->p[i])) return false;
        while (i < n && is_digit(c->p[i])) i++;
    }
    if (i < n && (c->p[i] == 'e' || c->p[i] == 'E')) {
        i++;
        if (i < n && (c->p[i] == '+' || c->p[i] == '-')) i++;
        if (i >= n || !is_digit(c->p[i])) return false;
        while (i < n && is_digit(c->p[i])) i++;
    }
    c->i = i;
    return true;
}

#define JSON_MAX_DEPTH 128 /* serde_json's recursion limit */

/* Skips one value (no surrounding whitespace). */
static bool j_value(jcur_t *c, int depth) {
    if (c->i >= c->n || depth > JSON_MAX_DEPTH) return false;
    switch (c->p[c->i]) {
    case '"':
        return j_string(c, NULL, NULL);
    case 't':
        return j_lit(c, "true");
    case 'f':
        return j_lit(c, "false");
    case 'n':
        return j_lit(c, "null");
    case '[':
        c->i++;
        j_ws(c);
        if (c->i < c->n && c->p[c->i] == ']') {
            c->i++;
            return true;
        }
        for (;;) {
            if (!j_value(c, depth + 1)) return false;
            j_ws(c);
            if (c->i >= c->n) return false;
            if (c->p[c->i] == ']') {
                c->i++;
                return true;
            }
            if (c->p[c->i] != ',') return false;
            c->i++;
            j_ws(c);
        }
    case '{':
        c->i++;
        j_ws(c);
        if (c->i < c->n && c->p[c->i] == '}') {
            c->i++;
            return true;
        }
        for (;;) {
            if (!j_string(c, NULL, NULL)) return false;
            j_ws(c);
            if (c->i >= c->n || c->p[c->i] != ':') return false;
            c->i++;
            j_ws(c);
            if (!j_value(c, depth + 1)) return false;
            j_ws(c);
            if (c->i >= c->n) return false;
            if (c->p[c->i] == '}') {
                c->i++;
                return true;
            }
            if (c->p[c->i] != ',') return false;
            c->i++;
            j_ws(c);
        }
    default:
        return j_number(c);
    }
}

bool sluice_json_valid(sluice_bytes_t json) {
    jcur_t c = {json.ptr, json.len, 0};
    j_ws(&c);
    if (!j_value(&c, 0)) return false;
    j_ws(&c);
    return c.i == c.n;
}

/* Parses a JSON integer (optional '-', no leading zeros, no fraction or
 * exponent, surrounding whitespace allowed) into magnitude and sign. */
static bool parse_json_int(sluice_bytes_t t, bool *negative, uint64_t *magnitude) {
    size_t i = 0, end = t.len;
    while (i < end && json_space(t.ptr[i])) i++;
    while (end > i && json_space(t.ptr[end - 1])) end--;
    *negative = i < end && t.ptr[i] == '-';
    if (*negative) i++;
    if (i == end || (t.ptr[i] == '0' && end - i > 1)) return false;
    uint64_t v = 0;
    for (; i < end; i++) {
        uint8_t c = t.ptr[i];
        if (c < '0' || c > '9') return false;
        if (v > (UINT64_MAX - (c - '0')) / 10) return false;
        v = v * 10 + (c - '0');
    }
    *magnitude = v;
    return true;
}

static bool json_to_i64(sluice_bytes_t json, int64_t *value) {
    bool neg;
    uint64_t m;
    if (!parse_json_int(json, &neg, &m) || m > (neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX)) return false;
    *value = neg ? (int64_t)(0 - m) : (int64_t)m;
    return true;
}

static bool json_to_u64(sluice_bytes_t json, uint64_t *value) {
    bool neg;
    return parse_json_int(json, &neg, value) && !(neg && *value);
}

static int not_a(const char *what, const char *type, sluice_bytes_t json) {
    int n = json.len > 40 ? 40 : (int)json.len;
    return sluice_error("%s: stored value is not a %s: %.*s%s", what, type, n, (const char *)json.ptr,
                        json.len > 40 ? "..." : "");
}

int sluice_json_u64(sluice_bytes_t json, uint64_t *value) {
    return json_to_u64(json, value) ? SLUICE_OK : not_a("JSON", "u64", json);
}

int sluice_json_i64(sluice_bytes_t json, int64_t *value) {
    return json_to_i64(json, value) ? SLUICE_OK : not_a("JSON", "i64", json);
}

int sluice_json_array_foreach(sluice_bytes_t json, sluice_json_item_fn fn, void *ctx) {
    if (!sluice_json_valid(json)) return sluice_error("invalid JSON: expected a JSON array");
    jcur_t c = {json.ptr, json.len, 0};
    j_ws(&c);
    if (c.i >= c.n || c.p[c.i] != '[') return sluice_error("invalid JSON: expected a JSON array");
    c.i++;
    j_ws(&c);
    if (c.p[c.i] == ']') return SLUICE_OK;
    for (;;) {
        size_t start = c.i;
        j_value(&c, 1);
        int rc = fn(sluice_bytes(c.p + start, c.i - start), ctx);
        if (rc != SLUICE_OK) return rc;
        j_ws(&c);
        if (c.p[c.i] == ']') return SLUICE_OK;
        c.i++; /* ',' */
        j_ws(&c);
    }
}

void sluice_buf_append_json_string(sluice_buf_t *b, sluice_bytes_t s) {
    buf_byte(b, '"');
    for (size_t i = 0; i < s.len; i++) {
        uint8_t ch = s.ptr[i];
        switch (ch) {
        case '"': sluice_buf_append_str(b, "\\\""); break;
        case '\\': sluice_buf_append_str(b, "\\\\"); break;
        case '\n': sluice_buf_append_str(b, "\\n"); break;
        case '\r': sluice_buf_append_str(b, "\\r"); break;
        case '\t': sluice_buf_append_str(b, "\\t"); break;
        case '\b': sluice_buf_append_str(b, "\\b"); break;
        case '\f': sluice_buf_append_str(b, "\\f"); break;
        default:
            if (ch < 0x20) sluice_buf_printf(b, "\\u%04x", ch);
            else buf_byte(b, ch);
        }
    }
    buf_byte(b, '"');
}

/* ---- configuration ----------------------------------------------------- */

struct sluice_config {
    const packed_out_list_tuple2_string_string_t *entries;
};

bool sluice_config_get(const sluice_config_t *config, const char *name, sluice_bytes_t *value) {
    size_t nlen = strlen(name);
    bool found = false;
    for (size_t i = 0; i < config->entries->len; i++) {
        const packed_out_tuple2_string_string_t *e = &config->entries->ptr[i];
        if (e->f0.len == nlen && memcmp(e->f0.ptr, name, nlen) == 0) {
            value->ptr = e->f1.ptr;
            value->len = e->f1.len;
            found = true;
        }
    }
    return found;
}

/* humantime's units, as Python's _DURATION_UNITS_NS. */
static const struct {
    const char *name;
    uint64_t ns;
} UNITS[] = {
    {"nanos", 1}, {"nsec", 1}, {"ns", 1},
    {"usec", 1000}, {"us", 1000}, {"\xc2\xb5s", 1000},
    {"millis", 1000000}, {"msec", 1000000}, {"ms", 1000000},
    {"seconds", 1000000000ull}, {"second", 1000000000ull}, {"secs", 1000000000ull}, {"sec", 1000000000ull},
    {"s", 1000000000ull},
    {"minutes", 60000000000ull}, {"minute", 60000000000ull}, {"mins", 60000000000ull}, {"min", 60000000000ull},
    {"m", 60000000000ull},
    {"hours", 3600000000000ull}, {"hour", 3600000000000ull}, {"hrs", 3600000000000ull}, {"hr", 3600000000000ull},
    {"h", 3600000000000ull},
    {"days", 86400000000000ull}, {"day", 86400000000000ull}, {"d", 86400000000000ull},
    {"weeks", 604800000000000ull}, {"week", 604800000000000ull}, {"w", 604800000000000ull},
    {"months", 2630016000000000ull}, {"month", 2630016000000000ull}, {"M", 2630016000000000ull},
    {"years", 31557600000000000ull}, {"year", 31557600000000000ull}, {"y", 31557600000000000ull},
};

static bool ascii_space(uint8_t c) { return c == ' ' || (c >= '\t' && c <= '\r'); }
static bool ascii_alpha(uint8_t c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

/* The reason `text` (already trimmed) is no duration, in `why`, or 0. */
static int parse_duration(const uint8_t *t, size_t n, int64_t *out, char *why, size_t why_len) {
    if (n == 0) return snprintf(why, why_len, "empty duration"), -1;
    uint64_t ms = 0, ns = 0;
    size_t i = 0;
    while (i < n) {
        while (i < n && ascii_space(t[i])) i++;
        size_t j = i;
        uint64_t number = 0;
        bool too_large = false;
        while (j < n && is_digit(t[j])) {
            if (number > (UINT64_MAX - (t[j] - '0')) / 10) too_large = true;
            else number = number * 10 + (t[j] - '0');
            j++;
        }
        if (j == i) return snprintf(why, why_len, "expected a number at %zu", i), -1;
        if (too_large) return snprintf(why, why_len, "number is too large"), -1;
        while (j < n && ascii_space(t[j])) j++;
        size_t k = j;
        while (k < n && (ascii_alpha(t[k]) || (t[k] == 0xc2 && k + 1 < n && t[k + 1] == 0xb5))) k += t[k] == 0xc2 ? 2 : 1;
        if (k == j && k < n) return snprintf(why, why_len, "invalid character at %zu", k), -1;
        uint64_t unit = 0;
        for (size_t u = 0; u < sizeof UNITS / sizeof UNITS[0]; u++) {
            if (strlen(UNITS[u].name) == k - j && memcmp(UNITS[u].name, t + j, k - j) == 0) unit = UNITS[u].ns;
        }
        if (!unit)
            return snprintf(why, why_len, "unknown time unit \"%.*s\", supported units: ns, us, ms, s, m, h, d, w, M, y",
                            (int)(k - j), (const char *)t + j),
                   -1;
        if (unit >= 1000000) {
            uint64_t add;
            if (__builtin_mul_overflow(number, unit / 1000000, &add) || __builtin_add_overflow(ms, add, &ms))
                return snprintf(why, why_len, "number is too large"), -1;
        } else {
            uint64_t per_ms = 1000000 / unit;
            if (__builtin_add_overflow(ms, number / per_ms, &ms)) return snprintf(why, why_len, "number is too large"), -1;
            ns += (number % per_ms) * unit;
            if (ns >= 1000000) {
                if (__builtin_add_overflow(ms, ns / 1000000, &ms))
                    return snprintf(why, why_len, "number is too large"), -1;
                ns %= 1000000;
            }
        }
        if (k < n && !ascii_space(t[k]) && !is_digit(t[k])) return snprintf(why, why_len, "invalid character at %zu", k), -1;
        i = k;
    }
    *out = ms > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)ms;
    return 0;
}

int sluice_parse_duration_ms(sluice_bytes_t text, int64_t *ms) {
    size_t i = 0, n = text.len;
    while (i < n && ascii_space(text.ptr[i])) i++;
    while (n > i && ascii_space(text.ptr[n - 1])) n--;
    char why[160];
    if (parse_duration(text.ptr + i, n - i, ms, why, sizeof why)) return sluice_error("%s", why);
    return SLUICE_OK;
}

int sluice_config_duration_ms(const sluice_config_t *config, const char *name, int64_t default_ms, int64_t *ms) {
    sluice_bytes_t raw;
    if (!sluice_config_get(config, name, &raw)) {
        *ms = default_ms;
        return SLUICE_OK;
    }
    size_t i = 0, n = raw.len;
    while (i < n && ascii_space(raw.ptr[i])) i++;
    while (n > i && ascii_space(raw.ptr[n - 1])) n--;
    char why[160];
    if (parse_duration(raw.ptr + i, n - i, ms, why, sizeof why))
        return sluice_error("config key `%s`: invalid duration \"%.*s\" (e.g. 10s, 1m, 500ms): %s", name, (int)raw.len,
                            (const char *)raw.ptr, why);
    return SLUICE_OK;
}

/* ---- input records ----------------------------------------------------- */

bool sluice_record_has_key(const sluice_record_t *r) { return r->key.is_some; }

sluice_bytes_t sluice_record_key_or_empty(const sluice_record_t *r) {
    sluice_bytes_t b = {(const uint8_t *)"", 0};
    if (r->key.is_some && r->key.val.len) {
        b.ptr = r->key.val.ptr;
        b.len = r->key.val.len;
    }
    return b;
}

bool sluice_record_has_value(const sluice_record_t *r) { return r->value.is_some; }

sluice_bytes_t sluice_record_value_or_empty(const sluice_record_t *r) {
    sluice_bytes_t b = {(const uint8_t *)"", 0};
    if (r->value.is_some && r->value.val.len) {
        b.ptr = r->value.val.ptr;
        b.len = r->value.val.len;
    }
    return b;
}

bool sluice_record_header(const sluice_record_t *r, const char *name, sluice_bytes_t *value) {
    size_t nlen = strlen(name);
    for (size_t i = r->headers.len; i-- > 0;) {
        const sluice_transform_types_header_t *h = &r->headers.ptr[i];
        if (h->key.len == nlen && memcmp(h->key.ptr, name, nlen) == 0) {
            value->ptr = h->value.ptr;
            value->len = h->value.len;
            return true;
        }
    }
    return false;
}

bool sluice_record_timestamp(const sluice_record_t *r, int64_t *ms) {
    if (r->timestamp.is_some) *ms = r->timestamp.val;
    return r->timestamp.is_some;
}

bool sluice_record_is_late(const sluice_record_t *r) {
    int64_t w;
    return r->timestamp.is_some && sluice_watermark(&w) && r->timestamp.val <= w;
}

sluice_bytes_t sluice_record_topic(const sluice_record_t *r) {
    sluice_bytes_t b = {r->topic.ptr, r->topic.len};
    return b;
}

/* ---- output records ---------------------------------------------------- */

/* A call's outputs, written in wit/sluice.wit's `packed-outputs` layout as
 * they are emitted: a u32 count, then per record its flags, topic, key,
 * value and headers, in one buffer. `process-packed-out` returns that
 * buffer as it is: no allocation per record on either side of the
 * boundary. The exports that return a list of records build it from the
 * buffer when the call ends (`outputs_list`). */
struct sluice_emitter {
    sluice_buf_t packed;
    uint32_t count;
    size_t headers_at; /* where the last record's header count is */
};

enum { OUT_KEY = 1, OUT_VALUE = 2, OUT_TOPIC = 4 };

/* The size of the last call's outputs (up to OUTPUTS_HINT_MAX): the next
 * call's first guess, so a steady stream of batches does not regrow its
 * buffer every call, and one huge batch does not make every later call
 * allocate as much. */
static size_t outputs_hint;
#define OUTPUTS_HINT_MAX (1u << 20)

static void emitter_begin(sluice_emitter_t *out) {
    *out = (sluice_emitter_t){{0}, 0, 0};
    buf_reserve(&out->packed, outputs_hint > 64 ? outputs_hint : 64);
    buf_u32(&out->packed, 0); /* the count, once known */
}

/* The finished `packed-outputs` string; the emitter no longer owns it. */
static sluice_buf_t emitter_finish(sluice_emitter_t *out) {
    buf_patch_count(&out->packed, out->count);
    outputs_hint = out->packed.len < OUTPUTS_HINT_MAX ? out->packed.len : OUTPUTS_HINT_MAX;
    sluice_buf_t b = out->packed;
    out->packed = (sluice_buf_t){0};
    return b;
}

/* A length the layout can carry (a u32), or an error naming `what`. */
static int out_len(size_t len, const char *what) {
    if ((uint64_t)len > UINT32_MAX) return sluice_error("output %s of %zu bytes is longer than 4 GiB", what, len);
    return SLUICE_OK;
}

static void out_bytes(sluice_buf_t *b, const uint8_t *p, size_t len) {
    buf_u32(b, (uint32_t)len);
    sluice_buf_append(b, p, len);
}

int sluice_emit_record(sluice_emitter_t *out, const sluice_bytes_t *key, const sluice_bytes_t *value,
                       const char *topic) {
    size_t topic_len = topic ? strlen(topic) : 0;
    if ((key && out_len(key->len, "key")) || (value && out_len(value->len, "value")) ||
        (topic && out_len(topic_len, "topic")))
        return SLUICE_ERR;
    if (out->count == UINT32_MAX) return sluice_error("more than %" PRIu32 " outputs in one call", UINT32_MAX);
    sluice_buf_t *b = &out->packed;
    buf_reserve(b, 1 + 4 * 4 + topic_len + (key ? key->len : 0) + (value ? value->len : 0));
    buf_byte(b, (uint8_t)((key ? OUT_KEY : 0) | (value ? OUT_VALUE : 0) | (topic ? OUT_TOPIC : 0)));
    if (topic) out_bytes(b, (const uint8_t *)topic, topic_len);
    if (key) out_bytes(b, key->ptr, key->len);
    if (value) out_bytes(b, value->ptr, value->len);
    out->headers_at = b->len;
    buf_u32(b, 0);
    out->count++;
    return SLUICE_OK;
}

int sluice_emit(sluice_emitter_t *out, sluice_bytes_t key, sluice_bytes_t value) {
    return sluice_emit_record(out, &key, &value, NULL);
}

/* Appends a header to the last record: its headers end the buffer. */
static int push_header(sluice_emitter_t *out, const uint8_t *name, size_t nlen, sluice_bytes_t value) {
    if (out_len(nlen, "header name") || out_len(value.len, "header value")) return SLUICE_ERR;
    uint8_t *at = out->packed.ptr + out->headers_at;
    uint32_t n = (uint32_t)at[0] | (uint32_t)at[1] << 8 | (uint32_t)at[2] << 16 | (uint32_t)at[3] << 24;
    if (n == UINT32_MAX) return sluice_error("more than %" PRIu32 " headers on one output", UINT32_MAX);
    n++;
    for (int i = 0; i < 4; i++) at[i] = (uint8_t)(n >> (8 * i));
    out_bytes(&out->packed, name, nlen);
    out_bytes(&out->packed, value.ptr, value.len);
    return SLUICE_OK;
}

int sluice_emit_header(sluice_emitter_t *out, const char *name, sluice_bytes_t value) {
    if (out->count == 0) return sluice_error("sluice_emit_header: no record emitted yet");
    return push_header(out, (const uint8_t *)name, strlen(name), value);
}

int sluice_forward(sluice_emitter_t *out, const sluice_record_t *r) {
    sluice_bytes_t key = {r->key.val.ptr, r->key.val.len};
    sluice_bytes_t value = {r->value.val.ptr, r->value.val.len};
    if (sluice_emit_record(out, r->key.is_some ? &key : NULL, r->value.is_some ? &value : NULL, NULL)) return SLUICE_ERR;
    for (size_t i = 0; i < r->headers.len; i++) {
        const sluice_transform_types_header_t *h = &r->headers.ptr[i];
        sluice_bytes_t v = {h->value.ptr, h->value.len};
        if (push_header(out, h->key.ptr, h->key.len, v)) return SLUICE_ERR;
    }
    return SLUICE_OK;
}

size_t sluice_emitted(const sluice_emitter_t *out) { return out->count; }

/* A malloc'd copy of the next length-prefixed bytes of our own packed
 * outputs (NULL when empty, as the generated free functions expect). */
static packed_out_list_u8_t out_copy(unpacker_t *u) {
    packed_out_list_u8_t view = un_bytes(u);
    return (packed_out_list_u8_t){copy_bytes(view.ptr, view.len), view.len};
}

/* The records of a finished `packed-outputs` string (which it frees), as
 * the exports that return `list<output-record>` hand them over: every
 * part malloc'd for the generated post-return function to free. */
static packed_out_list_output_record_t outputs_list(sluice_buf_t packed) {
    unpacker_t u = {packed.ptr, packed.ptr + packed.len, false};
    uint32_t count = un_u32(&u);
    packed_out_list_output_record_t list = {count ? xmalloc(count * sizeof *list.ptr) : NULL, count};
    for (uint32_t i = 0; i < count; i++) {
        packed_out_output_record_t *o = &list.ptr[i];
        memset(o, 0, sizeof *o);
        uint8_t flags = un_u8(&u);
        if (flags & OUT_TOPIC) {
            packed_out_list_u8_t t = out_copy(&u);
            o->topic.is_some = true;
            o->topic.val = (packed_out_string_t){t.ptr, t.len};
        }
        if (flags & OUT_KEY) o->key.is_some = true, o->key.val = out_copy(&u);
        if (flags & OUT_VALUE) o->value.is_some = true, o->value.val = out_copy(&u);
        uint32_t headers = un_u32(&u);
        if (headers) {
            o->headers.ptr = xmalloc(headers * sizeof *o->headers.ptr);
            o->headers.len = headers;
            for (uint32_t h = 0; h < headers; h++) {
                packed_out_list_u8_t name = out_copy(&u);
                o->headers.ptr[h].key = (packed_out_string_t){name.ptr, name.len};
                o->headers.ptr[h].value = out_copy(&u);
            }
        }
    }
    sluice_buf_free(&packed);
    return list;
}

/* The digits of `n`, written right-aligned ending at `end`; returns the first. */
static char *u64_digits(uint64_t n, char *end) {
    do {
        *--end = (char)('0' + n % 10);
        n /= 10;
    } while (n);
    return end;
}

/* Numbers are state values and outputs of every record: formatting them
 * by hand, not with snprintf, saves the guest thousands of instructions
 * per record (printf's machinery is large in wasm). */
sluice_bytes_t sluice_u64_text(uint64_t n, char buf[21]) {
    char tmp[20];
    char *first = u64_digits(n, tmp + sizeof tmp);
    size_t len = (size_t)(tmp + sizeof tmp - first);
    memcpy(buf, first, len);
    buf[len] = 0;
    sluice_bytes_t b = {(const uint8_t *)buf, len};
    return b;
}

sluice_bytes_t sluice_i64_text(int64_t n, char buf[21]) {
    char tmp[21];
    /* The magnitude as unsigned, so INT64_MIN needs no special case. */
    uint64_t magnitude = n < 0 ? 0 - (uint64_t)n : (uint64_t)n;
    char *first = u64_digits(magnitude, tmp + sizeof tmp);
    if (n < 0) *--first = '-';
    size_t len = (size_t)(tmp + sizeof tmp - first);
    memcpy(buf, first, len);
    buf[len] = 0;
    sluice_bytes_t b = {(const uint8_t *)buf, len};
    return b;
}

/* ---- time -------------------------------------------------------------- */

static bool in_shard; /* a shard call (process, on-timers, migrate): timers allowed */
static bool watermark_asked, watermark_some;
static int64_t watermark_at;
static bool now_asked;
static int64_t now_at;

bool sluice_watermark(int64_t *ms) {
    if (!watermark_asked) {
        watermark_some = sluice_transform_time_watermark(&watermark_at);
        watermark_asked = true;
    }
    if (watermark_some && ms) *ms = watermark_at;
    return watermark_some;
}

int64_t sluice_processing_time(void) {
    if (!now_asked) {
        now_at = sluice_transform_time_processing_time();
        now_asked = true;
    }
    return now_at;
}

static int timer_call(bool set, sluice_clock_t clock, sluice_bytes_t key, int64_t at) {
    if (!in_shard) return sluice_error("timers belong to a shard: set them in process, on_timer or migrate, not init");
    if (clock != SLUICE_CLOCK_EVENT && clock != SLUICE_CLOCK_PROCESSING) return sluice_error("unknown clock %d", clock);
    sluice_transform_time_timer_t t = {(sluice_transform_time_clock_t)clock, {(uint8_t *)key.ptr, key.len}, at};
    if (set) sluice_transform_time_set_timer(&t);
    else sluice_transform_time_delete_timer(&t);
    return SLUICE_OK;
}

int sluice_timer_set(sluice_clock_t clock, sluice_bytes_t key, int64_t at) { return timer_call(true, clock, key, at); }

int sluice_timer_delete(sluice_clock_t clock, sluice_bytes_t key, int64_t at) {
    return timer_call(false, clock, key, at);
}

/* The timers `timer_set_once_per_call` has set in the running call (keys
 * malloc'd), forgotten when a call begins or ends. */
typedef struct call_timer {
    sluice_clock_t clock;
    int64_t at;
    uint8_t *key;
    size_t key_len;
} call_timer_t;

static call_timer_t *call_set;
static size_t call_set_len, call_set_cap;

static void call_set_clear(void) {
    for (size_t i = 0; i < call_set_len; i++) free(call_set[i].key);
    call_set_len = 0;
}

/* Sets a timer unless the running call has set it through here already:
 * windows set the same timer for every key's first record, and one
 * crossing per call does (setting a set timer does nothing). */
static int timer_set_once_per_call(sluice_clock_t clock, sluice_bytes_t key, int64_t at) {
    for (size_t i = 0; i < call_set_len; i++) {
        const call_timer_t *t = &call_set[i];
        if (t->clock == clock && t->at == at && t->key_len == key.len && (key.len == 0 || memcmp(t->key, key.ptr, key.len) == 0))
            return SLUICE_OK;
    }
    if (timer_call(true, clock, key, at)) return SLUICE_ERR;
    if (call_set_len == call_set_cap) {
        call_set_cap = call_set_cap ? call_set_cap * 2 : 8;
        call_set = xrealloc(call_set, call_set_cap * sizeof *call_set);
    }
    call_set[call_set_len++] = (call_timer_t){clock, at, copy_bytes(key.ptr, key.len), key.len};
    return SLUICE_OK;
}

/* ---- the per-call state cache ------------------------------------------ */

/* One cached entry: the value as the call sees it (`present` false: absent
 * or deleted) and whether the host has yet to hear about it. */
typedef struct slot {
    uint8_t *key; /* in `cache_bytes`; NULL: empty slot. State keys are never empty (name 0x00 ...). */
    size_t key_len;
    uint64_t hash;
    uint8_t *value; /* NULL when empty; malloc'd when `value_heap`, else in `cache_bytes` */
    size_t value_len;
    bool value_heap;
    bool present;
    bool dirty;
    bool unknown; /* a prefetch's placeholder not filled (it failed): nothing is known of it */
} slot_t;

static slot_t *slots;   /* open addressing, linear probing */
static size_t slot_cap; /* a power of two, or 0 */
static size_t slot_count;
static size_t *dirty; /* slot indices in the order they became dirty */
static size_t dirty_len, dirty_cap;

/* What the cache's entries hold: ENTRY_BYTES each (the allocator's
 * rounding of a value of its own) plus its key and value. With its tables
 * and byte blocks as allocated (`cache_footprint`), what holding a shard's
 * cache across calls counts against the host's `max-bytes`. */
#define ENTRY_BYTES 16
static size_t cache_size;

/* The bytes of the cache's keys and of the values it read from the host,
 * bump-allocated in blocks and dropped together when the cache is emptied:
 * no malloc or free per entry. (A value written in the call is malloc'd,
 * since one key may be rewritten many times with values of new lengths.) */
typedef struct bytes_block {
    struct bytes_block *next;
    size_t used, cap;
    uint8_t data[];
} bytes_block_t;

static bytes_block_t *cache_bytes; /* the newest block first */
static size_t cache_blocks_bytes;  /* what its blocks take */

/* A cache's first block, and the most one grows to: each is twice the
 * last, so a held shard of a few keys keeps a small one. */
#define CACHE_BYTES_FIRST 1024
#define CACHE_BYTES_BLOCK 65536

/* A copy of `p` in `cache_bytes`, or NULL when it is empty. */
static uint8_t *cache_bytes_copy(const uint8_t *p, size_t n) {
    if (n == 0) return NULL;
    if (!cache_bytes || cache_bytes->cap - cache_bytes->used < n) {
        size_t grown = cache_bytes ? cache_bytes->cap * 2 : CACHE_BYTES_FIRST;
        if (grown > CACHE_BYTES_BLOCK) grown = CACHE_BYTES_BLOCK;
        size_t cap = n > grown ? n : grown;
        bytes_block_t *b = xmalloc(sizeof *b + cap);
        b->next = cache_bytes;
        b->used = 0;
        b->cap = cap;
        cache_bytes = b;
        cache_blocks_bytes += sizeof *b + cap;
    }
    uint8_t *out = cache_bytes->data + cache_bytes->used;
    memcpy(out, p, n);
    cache_bytes->used += n;
    return out;
}

/* Drops every copy, keeping one block for the next call. */
static void cache_bytes_reset(void) {
    if (!cache_bytes) return;
    for (bytes_block_t *b = cache_bytes->next, *next; b; b = next) {
        next = b->next;
        cache_blocks_bytes -= sizeof *b + b->cap;
        free(b);
    }
    cache_bytes->next = NULL;
    cache_bytes->used = 0;
}

/* The cache's hash of a key: a word at a time, each mixed by a multiply,
 * and murmur3's finalizer so the low bits (the probe start) are good. Only
 * this cache sees it, so it can change freely. */
static uint64_t key_hash(const uint8_t *p, size_t n) {
    uint64_t h = 0x9e3779b97f4a7c15u ^ (uint64_t)n, w;
    for (; n >= 8; p += 8, n -= 8) {
        memcpy(&w, p, 8); /* one unaligned load */
        h = (h ^ w) * 0xff51afd7ed558ccdu;
        h ^= h >> 32;
    }
    w = 0;
    for (size_t i = 0; i < n; i++) w |= (uint64_t)p[i] << (8 * i);
    h ^= w;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdu;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53u;
    h ^= h >> 33;
    return h;
}

/* Whether the `n` bytes at `a` and `b` are equal, a word at a time:
 * wasi-libc's memcmp goes byte by byte. */
static bool same_bytes(const uint8_t *a, const uint8_t *b, size_t n) {
    uint64_t x, y;
    for (; n >= 8; a += 8, b += 8, n -= 8) {
        memcpy(&x, a, 8); /* one unaligned load each */
        memcpy(&y, b, 8);
        if (x != y) return false;
    }
    for (; n; a++, b++, n--) {
        if (*a != *b) return false;
    }
    return true;
}

static slot_t *cache_find(const uint8_t *key, size_t len, uint64_t hash) {
    if (!slot_cap) return NULL;
    for (size_t i = hash & (slot_cap - 1);; i = (i + 1) & (slot_cap - 1)) {
        slot_t *s = &slots[i];
        if (!s->key) return NULL;
        if (s->hash == hash && s->key_len == len && same_bytes(s->key, key, len)) return s;
    }
}

static void cache_grow(void) {
    size_t old_cap = slot_cap;
    slot_t *old = slots;
    slot_cap = old_cap ? old_cap * 2 : 64;
    slots = calloc(slot_cap, sizeof *slots);
    if (!slots) abort();
    /* Rehashing moves slots, so the dirty list is rebuilt in its old order. */
    size_t *moved = dirty_len ? xmalloc(old_cap * sizeof *moved) : NULL;
    for (size_t j = 0; j < old_cap; j++) {
        if (!old[j].key) continue;
        size_t i = old[j].hash & (slot_cap - 1);
        while (slots[i].key) i = (i + 1) & (slot_cap - 1);
        slots[i] = old[j];
        if (moved) moved[j] = i;
    }
    for (size_t d = 0; d < dirty_len; d++) dirty[d] = moved[dirty[d]];
    free(moved);
    free(old);
}

/* Inserts a new entry for `key` (copied); the key must not be cached yet. */
static slot_t *cache_insert(const uint8_t *key, size_t len, uint64_t hash) {
    if ((slot_count + 1) * 4 > slot_cap * 3) cache_grow();
    size_t i = hash & (slot_cap - 1);
    while (slots[i].key) i = (i + 1) & (slot_cap - 1);
    slot_t *s = &slots[i];
    memset(s, 0, sizeof *s);
    s->key = cache_bytes_copy(key, len);
    s->key_len = len;
    s->hash = hash;
    slot_count++;
    cache_size += ENTRY_BYTES + len;
    return s;
}

static void mark_dirty(slot_t *s) {
    if (s->dirty) return;
    s->dirty = true;
    if (dirty_len == dirty_cap) {
        dirty_cap = dirty_cap ? dirty_cap * 2 : 16;
        dirty = xrealloc(dirty, dirty_cap * sizeof *dirty);
    }
    dirty[dirty_len++] = (size_t)(s - slots);
}

/* Forgets every entry (and any unflushed write). */
static void cache_discard(void) {
    for (size_t i = 0; i < slot_cap; i++) {
        if (!slots[i].key) continue;
        if (slots[i].value_heap) free(slots[i].value);
        slots[i].key = NULL;
    }
    cache_bytes_reset();
    slot_count = 0;
    dirty_len = 0;
    cache_size = 0;
}

/* Scratch for the packed state calls, kept from call to call. */
static sluice_buf_t packed_scratch;

/* Sends the dirty entries with one `state.write-packed` (none if nothing
 * changed) and keeps the cache: the host now has what it holds. */
static void cache_flush(void) {
    if (!dirty_len) return;
    sluice_buf_t *b = &packed_scratch;
    sluice_buf_clear(b);
    buf_u32(b, (uint32_t)dirty_len);
    for (size_t d = 0; d < dirty_len; d++) {
        slot_t *s = &slots[dirty[d]];
        buf_u32(b, (uint32_t)s->key_len);
        sluice_buf_append(b, s->key, s->key_len);
        buf_byte(b, s->present);
        if (s->present) {
            buf_u32(b, (uint32_t)s->value_len);
            sluice_buf_append(b, s->value, s->value_len);
        }
        s->dirty = false;
    }
    packed_out_list_u8_t entries = {b->ptr, b->len};
    sluice_transform_state_write_packed(&entries);
    dirty_len = 0;
}

/* Ends the cache: flushes, then empties it. */
static void cache_finish(void) {
    cache_flush();
    cache_discard();
}

/* Holding (world `cached`). A call's cache ends with the call (written
 * back, then forgotten) unless the host has said it will ask for held
 * state back (`hold-state`): then the cache of a batch's shard stays from
 * one batch of the shard to the next, within `max_held` bytes over all
 * shards, until the host's `flush-state` for it. The shard being served is
 * the cache above (`holding`); other held shards wait parked, each with
 * its tables as they were. This is the Rust SDK's store. */
typedef struct parked {
    uint32_t shard;
    slot_t *slots;
    size_t slot_cap, slot_count;
    size_t *dirty;
    size_t dirty_len, dirty_cap;
    bytes_block_t *cache_bytes;
    size_t blocks_bytes;
    size_t size; /* its entries, as cache_size counts them */
} parked_t;

static size_t max_held; /* 0: hold nothing (before `hold-state`) */
static bool holding;
static uint32_t holding_shard;
static parked_t *parked;
static size_t parked_len, parked_cap;
static size_t parked_size; /* their footprints */

/* What a cache takes: its entries (as cache_size counts them), its slot
 * table, its dirty list and its byte blocks. */
static size_t footprint_of(size_t size, size_t table_cap, size_t dirty_capacity, size_t blocks_bytes) {
    return size + table_cap * sizeof(slot_t) + dirty_capacity * sizeof(size_t) + blocks_bytes;
}

static size_t cache_footprint(void) { return footprint_of(cache_size, slot_cap, dirty_cap, cache_blocks_bytes); }

static size_t parked_footprint(const parked_t *p) {
    return footprint_of(p->size, p->slot_cap, p->dirty_cap, p->blocks_bytes);
}

/* Moves the cache into `parked` as `shard`'s; the cache is then empty. */
static void cache_park(uint32_t shard) {
    if (parked_len == parked_cap) {
        parked_cap = parked_cap ? parked_cap * 2 : 4;
        parked = xrealloc(parked, parked_cap * sizeof *parked);
    }
    parked[parked_len++] = (parked_t){
        .shard = shard, .slots = slots, .slot_cap = slot_cap, .slot_count = slot_count,
        .dirty = dirty, .dirty_len = dirty_len, .dirty_cap = dirty_cap,
        .cache_bytes = cache_bytes, .blocks_bytes = cache_blocks_bytes, .size = cache_size,
    };
    parked_size += cache_footprint();
    slots = NULL;
    dirty = NULL;
    cache_bytes = NULL;
    slot_cap = slot_count = dirty_len = dirty_cap = cache_size = cache_blocks_bytes = 0;
}

/* Takes `parked[i]` out of `parked` and makes its tables the cache; the
 * cache's own entries and tables are freed. */
static void cache_restore(size_t i) {
    parked_t p = parked[i];
    parked[i] = parked[--parked_len];
    parked_size -= parked_footprint(&p);
    cache_discard();
    free(slots);
    free(dirty);
    free(cache_bytes);
    slots = p.slots, slot_cap = p.slot_cap, slot_count = p.slot_count;
    dirty = p.dirty, dirty_len = p.dirty_len, dirty_cap = p.dirty_cap;
    cache_bytes = p.cache_bytes, cache_blocks_bytes = p.blocks_bytes, cache_size = p.size;
}

/* Makes `shard`'s parked tables the cache, if it has any (the cache must
 * hold nothing that is to stay). */
static void cache_unpark(uint32_t shard) {
    for (size_t i = 0; i < parked_len; i++) {
        if (parked[i].shard == shard) {
            cache_restore(i);
            return;
        }
    }
}

/* Starts a call for `shard` (`has_shard` false: a call without one): the
 * shard's held cache, if any, becomes the cache, and the one held before
 * is parked. What an unheld call left is dropped. */
static void cache_begin(bool has_shard, uint32_t shard) {
    if (!max_held) has_shard = false;
    if (has_shard && holding && shard == holding_shard) return;
    if (holding && slot_count) cache_park(holding_shard);
    else cache_discard();
    if (has_shard) cache_unpark(shard);
    holding = has_shard;
    holding_shard = shard;
}

/* Ends a call that succeeded: a shard's cache stays while all that is held
 * is within `max_held`; anything else is written back. */
static void cache_end(void) {
    if (holding && cache_footprint() + parked_size <= max_held) return;
    holding = false;
    cache_finish();
}

/* The host's `flush-state`: writes back what is held of `shard` and
 * forgets it. */
static void cache_give_back(uint32_t shard) {
    cache_begin(true, shard);
    holding = false;
    cache_finish();
}

/* Ends a failed call: drops every cache, held ones too, with their unsent
 * writes (the host ends the instance and rolls its epoch back). */
static void cache_drop_all(void) {
    while (parked_len) cache_restore(parked_len - 1); /* each frees the cache before it */
    cache_discard();
    holding = false;
}

/* The cached entry for the state key `k` (borrowed: a new entry copies it
 * into `cache_bytes`), or a new one, absent and clean, when there is none
 * (`*fresh`). */
static slot_t *cache_entry(const uint8_t *k, size_t len, bool *fresh) {
    uint64_t h = key_hash(k, len);
    slot_t *s = cache_find(k, len, h);
    *fresh = s == NULL;
    return s ? s : cache_insert(k, len, h);
}

/* The cached entry for `k`, fetched with one `state.get` on a miss. */
static slot_t *cache_read(const uint8_t *k, size_t len) {
    bool fresh;
    slot_t *s = cache_entry(k, len, &fresh);
    if (!fresh && !s->unknown) return s;
    s->unknown = false;
    packed_out_list_u8_t key = {s->key, len}, value = {NULL, 0};
    s->present = sluice_transform_state_get(&key, &value);
    /* For `none` the bindings copy out an uninitialised value: not ours. */
    if (!s->present) return s;
    if (value.len) {
        s->value = value.ptr; /* malloc'd by cabi_realloc: moves into the cache */
        s->value_len = value.len;
        s->value_heap = true;
        cache_size += value.len;
    } else {
        packed_out_list_u8_free(&value);
    }
    return s;
}

/* Stores (`value` non-NULL, copied) or deletes the value of the entry
 * `s`; `known`: the entry holds what the cache or the host has (it was not
 * just made for this write), so writing the same again changes nothing. */
static void slot_write(slot_t *s, bool known, const uint8_t *value, size_t value_len) {
    if (known) {
        bool same = s->present == (value != NULL) &&
                    (!value || (s->value_len == value_len && (value_len == 0 || memcmp(s->value, value, value_len) == 0)));
        if (same) return; /* the cache (and, if clean, the host) already has exactly this */
    }
    cache_size = cache_size + (value ? value_len : 0) - s->value_len; /* never below 0: s->value_len is in it */
    if (value && s->value && s->value_len == value_len) {
        memcpy(s->value, value, value_len); /* a counter's next value is mostly as long as the last */
    } else {
        if (s->value_heap) free(s->value);
        s->value = value ? copy_bytes(value, value_len) : NULL;
        s->value_len = value ? value_len : 0;
        s->value_heap = s->value != NULL;
    }
    s->present = value != NULL;
    mark_dirty(s);
}

/* Stores (`value` non-NULL, copied) or deletes the state key `k`
 * (borrowed). */
static void cache_write(const uint8_t *k, size_t len, const uint8_t *value, size_t value_len) {
    bool fresh;
    slot_t *s = cache_entry(k, len, &fresh);
    slot_write(s, !fresh && !s->unknown, value, value_len);
    s->unknown = false;
}

/* A prefetch: `prefetch_begin(n)`, `prefetch_add` for each of up to `n`
 * keys, `prefetch_end`, which loads every key not cached yet with one
 * get-many-packed. The keys asked for are packed in `packed_scratch` as
 * they are added, and their entries' places kept in `prefetch_slots`: the
 * table is grown for all `n` up front, so no entry moves before the answer
 * is read. */
static uint32_t prefetch_missing;
static size_t *prefetch_slots;
static size_t prefetch_slots_cap;

static void prefetch_begin(size_t n) {
    while ((slot_count + n) * 4 > slot_cap * 3) cache_grow();
    if (n > prefetch_slots_cap) {
        prefetch_slots = xrealloc(prefetch_slots, n * sizeof *prefetch_slots);
        prefetch_slots_cap = n;
    }
    sluice_buf_clear(&packed_scratch);
    buf_u32(&packed_scratch, 0); /* the count, once known */
    prefetch_missing = 0;
}

/* Adds the borrowed key `k`: a placeholder entry (unknown until the answer
 * fills it; clean) for a key not cached yet, which also keeps a key from
 * being asked for twice. */
static void prefetch_add(const uint8_t *k, size_t len) {
    bool fresh;
    slot_t *s = cache_entry(k, len, &fresh);
    if (!fresh) return;
    s->unknown = true;
    buf_u32(&packed_scratch, (uint32_t)len);
    sluice_buf_append(&packed_scratch, k, len);
    prefetch_slots[prefetch_missing++] = (size_t)(s - slots);
}

static int prefetch_end(void) {
    if (!prefetch_missing) return SLUICE_OK;
    sluice_buf_t *keys = &packed_scratch;
    buf_patch_count(keys, prefetch_missing);
    packed_out_list_u8_t arg = {keys->ptr, keys->len}, values = {NULL, 0};
    sluice_transform_state_get_many_packed(&arg, &values);
    unpacker_t got = {values.ptr, values.ptr + values.len, false};
    uint32_t n = prefetch_missing, count = un_u32(&got);
    int rc = SLUICE_OK;
    if (count != n) {
        rc = sluice_error("host bug: state.get-many-packed returned %" PRIu32 " values for %" PRIu32 " keys", count, n);
    }
    for (uint32_t i = 0; i < n && rc == SLUICE_OK && !got.bad; i++) {
        bool present = un_u8(&got) != 0;
        packed_out_list_u8_t v = present ? un_bytes(&got) : (packed_out_list_u8_t){NULL, 0};
        if (got.bad) break;
        slot_t *s = &slots[prefetch_slots[i]];
        s->unknown = false;
        s->present = present;
        s->value = cache_bytes_copy(v.ptr, v.len);
        s->value_len = v.len;
        cache_size += v.len;
    }
    if (rc == SLUICE_OK && got.bad) rc = sluice_error("host bug: state.get-many-packed returned a malformed answer");
    packed_out_list_u8_free(&values);
    return rc;
}

/* ---- state keys -------------------------------------------------------- */

static int check_name(const char *name) {
    if (!name || !name[0]) return sluice_error("state name must not be empty");
    return SLUICE_OK;
}

/* `name 0x00 key`, built in a buffer kept from call to call: valid until
 * the next key is built there. */
static sluice_buf_t key_scratch;

static int value_key(const char *name, sluice_bytes_t key, const uint8_t **out, size_t *len) {
    if (check_name(name)) return SLUICE_ERR;
    sluice_buf_clear(&key_scratch);
    sluice_buf_append(&key_scratch, name, strlen(name) + 1); /* with its NUL */
    sluice_buf_append(&key_scratch, key.ptr, key.len);
    *out = key_scratch.ptr;
    *len = key_scratch.len;
    return SLUICE_OK;
}

/* `name 0x00 u32_be(len(key)) key map_key`, malloc'd (`map_key` NULL: the
 * prefix of all of `key`'s entries). */
static int map_key(const char *name, sluice_bytes_t key, const sluice_bytes_t *mk, uint8_t **out, size_t *len) {
    if (check_name(name)) return SLUICE_ERR;
    if ((uint64_t)key.len > UINT32_MAX)
        return sluice_error("state `%s`: key of %zu bytes is too long for a map key", name, key.len);
    size_t n = strlen(name), m = mk ? mk->len : 0;
    uint8_t *k = xmalloc(n + 5 + key.len + m);
    memcpy(k, name, n);
    k[n] = 0;
    uint32_t l = (uint32_t)key.len;
    k[n + 1] = (uint8_t)(l >> 24);
    k[n + 2] = (uint8_t)(l >> 16);
    k[n + 3] = (uint8_t)(l >> 8);
    k[n + 4] = (uint8_t)l;
    if (key.len) memcpy(k + n + 5, key.ptr, key.len);
    if (m) memcpy(k + n + 5 + key.len, mk->ptr, m);
    *out = k;
    *len = n + 5 + key.len + m;
    return SLUICE_OK;
}

/* ---- time-to-live ------------------------------------------------------ */

static const uint8_t TTL_PREFIX[5] = {0, 't', 't', 'l', 0};

/* `[expires_at, value]`: the expiry and a view of the value; false if
 * `raw` is not that. */
static bool ttl_parse(sluice_bytes_t raw, int64_t *expires_at, sluice_bytes_t *value) {
    jcur_t c = {raw.ptr, raw.len, 0};
    j_ws(&c);
    if (c.i >= c.n || c.p[c.i] != '[') return false;
    c.i++;
    j_ws(&c);
    size_t start = c.i;
    if (!j_number(&c) || !json_to_i64(sluice_bytes(c.p + start, c.i - start), expires_at)) return false;
    j_ws(&c);
    if (c.i >= c.n || c.p[c.i] != ',') return false;
    c.i++;
    j_ws(&c);
    start = c.i;
    if (!j_value(&c, 1)) return false;
    if (value) *value = sluice_bytes(c.p + start, c.i - start);
    j_ws(&c);
    if (c.i >= c.n || c.p[c.i] != ']') return false;
    c.i++;
    j_ws(&c);
    return c.i == c.n;
}

/* Reads the state key `k` (borrowed): *json is the value, without
 * its expiry when `ttl_ms` > 0 (and *found false once it has expired). */
static int state_get(const char *name, int64_t ttl_ms, const uint8_t *k, size_t len, sluice_bytes_t *json,
                     bool *found) {
    slot_t *s = cache_read(k, len);
    sluice_bytes_t raw = {s->value ? s->value : (const uint8_t *)"", s->value_len};
    *found = s->present;
    *json = s->present ? raw : sluice_bytes("", 0);
    if (!s->present || ttl_ms <= 0) return SLUICE_OK;
    int64_t expires_at;
    if (!ttl_parse(raw, &expires_at, json)) {
        *found = false;
        *json = sluice_bytes("", 0);
        if (!sluice_json_valid(raw)) return sluice_error("state `%s`: invalid JSON", name);
        return sluice_error("state `%s`: invalid JSON: expected [expires_at, value], a state with a time-to-live", name);
    }
    if (expires_at <= sluice_processing_time()) {
        *found = false;
        *json = sluice_bytes("", 0);
    }
    return SLUICE_OK;
}

/* Writes `json` under the state key `k` (borrowed); with a TTL as
 * `[expires_at,json]`, with its expiry timer set. */
static int state_put(int64_t ttl_ms, const uint8_t *k, size_t len, sluice_bytes_t json) {
    if (ttl_ms <= 0) {
        cache_write(k, len, json.ptr ? json.ptr : (const uint8_t *)"", json.len);
        return SLUICE_OK;
    }
    int64_t expires_at = sat_add(sluice_processing_time(), ttl_ms);
    sluice_buf_t tk = {0};
    sluice_buf_append(&tk, TTL_PREFIX, sizeof TTL_PREFIX);
    sluice_buf_append(&tk, k, len);
    int rc = sluice_timer_set(SLUICE_CLOCK_PROCESSING, sluice_buf_bytes(&tk), expires_at);
    sluice_buf_free(&tk);
    if (rc) return rc;
    sluice_buf_t v = {0};
    sluice_buf_printf(&v, "[%" PRId64 ",", expires_at);
    sluice_buf_append(&v, json.ptr, json.len);
    buf_byte(&v, ']');
    cache_write(k, len, v.ptr, v.len);
    sluice_buf_free(&v);
    return SLUICE_OK;
}

/* If `t` is an expiry timer: deletes its entry unless it was written again
 * with a later expiry, and returns true. */
static bool ttl_expire(const sluice_timer_t *t) {
    if (t->clock != SLUICE_CLOCK_PROCESSING || t->key.len < sizeof TTL_PREFIX ||
        memcmp(t->key.ptr, TTL_PREFIX, sizeof TTL_PREFIX) != 0)
        return false;
    size_t len = t->key.len - sizeof TTL_PREFIX;
    if (len == 0) return true;
    const uint8_t *k = t->key.ptr + sizeof TTL_PREFIX;
    slot_t *s = cache_read(k, len);
    int64_t expires_at;
    if (s->present && ttl_parse(sluice_bytes(s->value ? s->value : (const uint8_t *)"", s->value_len), &expires_at, NULL) &&
        expires_at <= t->at) {
        cache_write(k, len, NULL, 0);
    }
    return true;
}

static int check_json(const char *name, sluice_bytes_t json) {
    if (!sluice_json_valid(json)) {
        int n = json.len > 40 ? 40 : (int)json.len;
        return sluice_error("state `%s`: not valid JSON: %.*s%s", name, n, (const char *)json.ptr,
                            json.len > 40 ? "..." : "");
    }
    return SLUICE_OK;
}

/* ---- value state ------------------------------------------------------- */

int sluice_value_prefetch_keys(const sluice_value_state_t *st, const sluice_bytes_t *keys, size_t n) {
    if (check_name(st->name)) return SLUICE_ERR;
    prefetch_begin(n);
    for (size_t i = 0; i < n; i++) {
        const uint8_t *k;
        size_t len;
        value_key(st->name, keys[i], &k, &len);
        prefetch_add(k, len);
    }
    return prefetch_end();
}

int sluice_value_prefetch(const sluice_value_state_t *st, const sluice_batch_t *batch) {
    sluice_bytes_t *keys = xmalloc(batch->len * sizeof *keys);
    for (size_t i = 0; i < batch->len; i++) keys[i] = sluice_record_key_or_empty(&batch->records[i]);
    int rc = sluice_value_prefetch_keys(st, keys, batch->len);
    free(keys);
    return rc;
}

int sluice_value_get_json(const sluice_value_state_t *st, sluice_bytes_t key, sluice_bytes_t *json, bool *found) {
    const uint8_t *k;
    size_t len;
    if (value_key(st->name, key, &k, &len)) return SLUICE_ERR;
    return state_get(st->name, st->ttl_ms, k, len, json, found);
}

/* set_json without the JSON check (for values the SDK wrote itself). */
static int value_put(const sluice_value_state_t *st, sluice_bytes_t key, sluice_bytes_t json) {
    const uint8_t *k;
    size_t len;
    if (value_key(st->name, key, &k, &len)) return SLUICE_ERR;
    return state_put(st->ttl_ms, k, len, json);
}

int sluice_value_set_json(const sluice_value_state_t *st, sluice_bytes_t key, sluice_bytes_t json) {
    if (check_name(st->name) || check_json(st->name, json)) return SLUICE_ERR;
    return value_put(st, key, json);
}

int sluice_value_clear(const sluice_value_state_t *st, sluice_bytes_t key) {
    const uint8_t *k;
    size_t len;
    if (value_key(st->name, key, &k, &len)) return SLUICE_ERR;
    cache_write(k, len, NULL, 0);
    return SLUICE_OK;
}

static int state_not_a(const char *name, const char *type, sluice_bytes_t json) {
    char what[200];
    snprintf(what, sizeof what, "state `%s`", name);
    return not_a(what, type, json);
}

int sluice_value_get_u64(const sluice_value_state_t *st, sluice_bytes_t key, uint64_t *value, bool *found) {
    sluice_bytes_t json;
    if (sluice_value_get_json(st, key, &json, found)) return SLUICE_ERR;
    if (!*found) return SLUICE_OK;
    if (!json_to_u64(json, value)) return state_not_a(st->name, "u64", json);
    return SLUICE_OK;
}

int sluice_value_set_u64(const sluice_value_state_t *st, sluice_bytes_t key, uint64_t value) {
    char buf[21];
    return value_put(st, key, sluice_u64_text(value, buf));
}

int sluice_value_get_i64(const sluice_value_state_t *st, sluice_bytes_t key, int64_t *value, bool *found) {
    sluice_bytes_t json;
    if (sluice_value_get_json(st, key, &json, found)) return SLUICE_ERR;
    if (!*found) return SLUICE_OK;
    if (!json_to_i64(json, value)) return state_not_a(st->name, "i64", json);
    return SLUICE_OK;
}

int sluice_value_set_i64(const sluice_value_state_t *st, sluice_bytes_t key, int64_t value) {
    char buf[21];
    return value_put(st, key, sluice_i64_text(value, buf));
}

int sluice_value_add_u64(const sluice_value_state_t *st, sluice_bytes_t key, uint64_t delta, uint64_t *result) {
    /* Without a time-to-live the counter's read and write go through one
     * cache entry (`s`), found once; with one, through get and set. */
    slot_t *s = NULL;
    uint64_t n = 0;
    bool found;
    if (st->ttl_ms <= 0) {
        const uint8_t *k;
        size_t len;
        if (value_key(st->name, key, &k, &len)) return SLUICE_ERR;
        s = cache_read(k, len);
        found = s->present;
        sluice_bytes_t json = {s->value ? s->value : (const uint8_t *)"", s->value_len};
        if (found && !json_to_u64(json, &n)) return state_not_a(st->name, "u64", json);
    } else if (sluice_value_get_u64(st, key, &n, &found)) {
        return SLUICE_ERR;
    }
    if (!found) n = 0;
    if (n > UINT64_MAX - delta) return sluice_error("state `%s`: u64 overflow", st->name);
    n += delta;
    if (result) *result = n;
    if (!s) return sluice_value_set_u64(st, key, n);
    char buf[21];
    sluice_bytes_t text = sluice_u64_text(n, buf);
    slot_write(s, true, text.ptr, text.len);
    return SLUICE_OK;
}

/* ---- list state -------------------------------------------------------- */

/* What Rust's trim_ascii trims. */
static bool trim_space(uint8_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\x0c' || c == '\r'; }

static bool is_json_array(sluice_bytes_t json) {
    size_t i = 0;
    while (i < json.len && json_space(json.ptr[i])) i++;
    return i < json.len && json.ptr[i] == '[' && sluice_json_valid(json);
}

int sluice_list_push_json(const sluice_list_state_t *st, sluice_bytes_t key, sluice_bytes_t item) {
    if (check_name(st->name) || check_json(st->name, item)) return SLUICE_ERR;
    const uint8_t *k;
    size_t len;
    if (value_key(st->name, key, &k, &len)) return SLUICE_ERR;
    slot_t *s = cache_read(k, len);
    sluice_buf_t out = {0};
    if (!s->present) {
        buf_byte(&out, '[');
        sluice_buf_append(&out, item.ptr, item.len);
        buf_byte(&out, ']');
    } else {
        const uint8_t *p = s->value;
        size_t a = 0, b = s->value_len;
        while (a < b && trim_space(p[a])) a++;
        while (b > a && trim_space(p[b - 1])) b--;
        if (b - a < 2 || p[a] != '[' || p[b - 1] != ']')
            return sluice_error("state `%s`: stored value is not a JSON array", st->name);
        size_t ia = a + 1, ib = b - 1;
        while (ia < ib && trim_space(p[ia])) ia++;
        sluice_buf_append(&out, p + a, b - 1 - a);
        if (ia < ib) buf_byte(&out, ',');
        sluice_buf_append(&out, item.ptr, item.len);
        buf_byte(&out, ']');
    }
    cache_write(k, len, out.ptr, out.len);
    sluice_buf_free(&out);
    return SLUICE_OK;
}

int sluice_list_get_json(const sluice_list_state_t *st, sluice_bytes_t key, sluice_bytes_t *json, bool *found) {
    const uint8_t *k;
    size_t len;
    if (value_key(st->name, key, &k, &len)) return SLUICE_ERR;
    if (state_get(st->name, 0, k, len, json, found)) return SLUICE_ERR;
    if (!*found) {
        *json = sluice_str("[]");
        return SLUICE_OK;
    }
    if (!is_json_array(*json)) return sluice_error("state `%s`: invalid JSON: expected a JSON array", st->name);
    return SLUICE_OK;
}

int sluice_list_foreach(const sluice_list_state_t *st, sluice_bytes_t key, sluice_json_item_fn fn, void *ctx) {
    sluice_bytes_t json;
    bool found;
    if (sluice_list_get_json(st, key, &json, &found)) return SLUICE_ERR;
    if (!found) return SLUICE_OK;
    /* A copy: `fn` may write this very list. */
    sluice_buf_t copy = {0};
    sluice_buf_append(&copy, json.ptr, json.len);
    int rc = sluice_json_array_foreach(sluice_buf_bytes(&copy), fn, ctx);
    sluice_buf_free(&copy);
    return rc;
}

int sluice_list_set_json(const sluice_list_state_t *st, sluice_bytes_t key, sluice_bytes_t json) {
    if (check_name(st->name)) return SLUICE_ERR;
    if (!is_json_array(json)) return sluice_error("state `%s`: a list must be a JSON array", st->name);
    const uint8_t *k;
    size_t len;
    if (value_key(st->name, key, &k, &len)) return SLUICE_ERR;
    cache_write(k, len, json.ptr, json.len);
    return SLUICE_OK;
}

int sluice_list_clear(const sluice_list_state_t *st, sluice_bytes_t key) {
    sluice_value_state_t v = {st->name, 0};
    return sluice_value_clear(&v, key);
}

int sluice_list_prefetch(const sluice_list_state_t *st, const sluice_batch_t *batch) {
    sluice_value_state_t v = {st->name, 0};
    return sluice_value_prefetch(&v, batch);
}

/* ---- map state --------------------------------------------------------- */

#define SCAN_PAGE 1024

int sluice_map_get_json(const sluice_map_state_t *st, sluice_bytes_t key, sluice_bytes_t mk, sluice_bytes_t *json,
                        bool *found) {
    uint8_t *k;
    size_t len;
    if (map_key(st->name, key, &mk, &k, &len)) return SLUICE_ERR;
    int rc = state_get(st->name, st->ttl_ms, k, len, json, found);
    free(k);
    return rc;
}

static int map_put(const sluice_map_state_t *st, sluice_bytes_t key, sluice_bytes_t mk, sluice_bytes_t json) {
    uint8_t *k;
    size_t len;
    if (map_key(st->name, key, &mk, &k, &len)) return SLUICE_ERR;
    int rc = state_put(st->ttl_ms, k, len, json);
    free(k);
    return rc;
}

int sluice_map_set_json(const sluice_map_state_t *st, sluice_bytes_t key, sluice_bytes_t mk, sluice_bytes_t json) {
    if (check_name(st->name) || check_json(st->name, json)) return SLUICE_ERR;
    return map_put(st, key, mk, json);
}

int sluice_map_remove(const sluice_map_state_t *st, sluice_bytes_t key, sluice_bytes_t mk) {
    uint8_t *k;
    size_t len;
    if (map_key(st->name, key, &mk, &k, &len)) return SLUICE_ERR;
    cache_write(k, len, NULL, 0);
    free(k);
    return SLUICE_OK;
}

/* Calls `fn(map_key, raw value)` for every entry of `key`'s map (expired
 * ones included), paging through scan-prefix after flushing. */
typedef int (*raw_entry_fn)(const sluice_map_state_t *st, sluice_bytes_t map_key, sluice_bytes_t raw, void *ctx);

static int map_scan(const sluice_map_state_t *st, sluice_bytes_t key, raw_entry_fn fn, void *ctx) {
    uint8_t *prefix;
    size_t plen;
    if (map_key(st->name, key, NULL, &prefix, &plen)) return SLUICE_ERR;
    sluice_buf_t after = {0};
    bool have_after = false;
    int rc = SLUICE_OK;
    for (;;) {
        cache_flush(); /* the host sees this call's writes (also those `fn` made) */
        packed_out_list_u8_t p = {prefix, plen}, a = {after.ptr, after.len};
        packed_out_list_tuple2_list_u8_list_u8_t page = {NULL, 0};
        sluice_transform_state_scan_prefix(&p, have_after ? &a : NULL, SCAN_PAGE, &page);
        size_t got = page.len;
        for (size_t i = 0; i < page.len && rc == SLUICE_OK; i++) {
            const packed_out_list_u8_t *k = &page.ptr[i].f0, *v = &page.ptr[i].f1;
            bool in_order = !have_after || (k->len > 0 && (memcmp(k->ptr, after.ptr, k->len < after.len ? k->len : after.len) > 0 ||
                                                           (memcmp(k->ptr, after.ptr, k->len < after.len ? k->len : after.len) == 0 &&
                                                            k->len > after.len)));
            if (k->len < plen || memcmp(k->ptr, prefix, plen) != 0 || !in_order) {
                rc = sluice_error("host bug: state.scan-prefix returned a key out of order or outside the prefix (state `%s`)",
                                  st->name);
                break;
            }
            sluice_buf_clear(&after);
            sluice_buf_append(&after, k->ptr, k->len);
            have_after = true;
            rc = fn(st, sluice_bytes(k->ptr + plen, k->len - plen), sluice_bytes(v->ptr ? v->ptr : (const uint8_t *)"", v->len),
                    ctx);
        }
        packed_out_list_tuple2_list_u8_list_u8_free(&page);
        if (rc != SLUICE_OK || got < SCAN_PAGE) break;
    }
    free(prefix);
    sluice_buf_free(&after);
    return rc;
}

typedef struct {
    sluice_map_entry_fn fn;
    void *ctx;
} live_ctx_t;

static int live_entry(const sluice_map_state_t *st, sluice_bytes_t mk, sluice_bytes_t raw, void *ctx) {
    live_ctx_t *l = ctx;
    sluice_bytes_t value = raw;
    if (st->ttl_ms > 0) {
        int64_t expires_at;
        if (!ttl_parse(raw, &expires_at, &value)) {
            if (!sluice_json_valid(raw)) return sluice_error("state `%s`: invalid JSON", st->name);
            return sluice_error("state `%s`: invalid JSON: expected [expires_at, value], a state with a time-to-live",
                                st->name);
        }
        if (expires_at <= sluice_processing_time()) return SLUICE_OK;
    }
    return l->fn(mk, value, l->ctx);
}

int sluice_map_foreach(const sluice_map_state_t *st, sluice_bytes_t key, sluice_map_entry_fn fn, void *ctx) {
    live_ctx_t l = {fn, ctx};
    return map_scan(st, key, live_entry, &l);
}

typedef struct {
    uint8_t **keys;
    size_t *lens;
    size_t len, cap;
    sluice_bytes_t record_key;
} doomed_t;

static int doom_entry(const sluice_map_state_t *st, sluice_bytes_t mk, sluice_bytes_t raw, void *ctx) {
    (void)raw;
    doomed_t *d = ctx;
    if (d->len == d->cap) {
        d->cap = d->cap ? d->cap * 2 : 16;
        d->keys = xrealloc(d->keys, d->cap * sizeof *d->keys);
        d->lens = xrealloc(d->lens, d->cap * sizeof *d->lens);
    }
    if (map_key(st->name, d->record_key, &mk, &d->keys[d->len], &d->lens[d->len])) return SLUICE_ERR;
    d->len++;
    return SLUICE_OK;
}

int sluice_map_clear(const sluice_map_state_t *st, sluice_bytes_t key) {
    doomed_t d = {NULL, NULL, 0, 0, key};
    int rc = map_scan(st, key, doom_entry, &d);
    for (size_t i = 0; i < d.len; i++) {
        if (rc == SLUICE_OK) cache_write(d.keys[i], d.lens[i], NULL, 0);
        free(d.keys[i]);
    }
    free(d.keys);
    free(d.lens);
    return rc;
}

static sluice_bytes_t be_bytes(uint64_t v, uint8_t *buf, int width) {
    for (int i = 0; i < width; i++) buf[i] = (uint8_t)(v >> (8 * (width - 1 - i)));
    return sluice_bytes(buf, (size_t)width);
}

sluice_bytes_t sluice_map_key_u32(uint32_t v, uint8_t buf[4]) { return be_bytes(v, buf, 4); }
sluice_bytes_t sluice_map_key_u64(uint64_t v, uint8_t buf[8]) { return be_bytes(v, buf, 8); }
sluice_bytes_t sluice_map_key_i32(int32_t v, uint8_t buf[4]) { return be_bytes((uint32_t)v ^ 0x80000000u, buf, 4); }
sluice_bytes_t sluice_map_key_i64(int64_t v, uint8_t buf[8]) {
    return be_bytes((uint64_t)v ^ 0x8000000000000000ull, buf, 8);
}

int sluice_map_key_decode_u64(sluice_bytes_t b, uint64_t *v) {
    if (b.len != 8) return sluice_error("map key of %zu bytes is not a u64", b.len);
    uint64_t x = 0;
    for (int i = 0; i < 8; i++) x = (x << 8) | b.ptr[i];
    *v = x;
    return SLUICE_OK;
}

int sluice_map_key_decode_i64(sluice_bytes_t b, int64_t *v) {
    if (b.len != 8) return sluice_error("map key of %zu bytes is not a i64", b.len);
    uint64_t x = 0;
    for (int i = 0; i < 8; i++) x = (x << 8) | b.ptr[i];
    *v = (int64_t)(x ^ 0x8000000000000000ull);
    return SLUICE_OK;
}

/* ---- windows ----------------------------------------------------------- */

int sluice_fold_count(const sluice_bytes_t *acc, sluice_buf_t *out, void *ctx) {
    (void)ctx;
    uint64_t n = 0;
    if (acc && sluice_json_u64(*acc, &n)) return SLUICE_ERR;
    if (n == UINT64_MAX) return sluice_error("count overflow");
    sluice_buf_printf(out, "%" PRIu64, n + 1);
    return SLUICE_OK;
}

int sluice_fold_sum_i64(const sluice_bytes_t *acc, sluice_buf_t *out, void *ctx) {
    int64_t n = 0, sum;
    if (acc && sluice_json_i64(*acc, &n)) return SLUICE_ERR;
    if (__builtin_add_overflow(n, *(const int64_t *)ctx, &sum)) return sluice_error("i64 overflow");
    sluice_buf_printf(out, "%" PRId64, sum);
    return SLUICE_OK;
}

int sluice_merge_sum(sluice_bytes_t a, sluice_bytes_t b, sluice_buf_t *out, void *ctx) {
    (void)ctx;
    uint64_t ua, ub, us;
    if (json_to_u64(a, &ua) && json_to_u64(b, &ub) && !__builtin_add_overflow(ua, ub, &us)) {
        sluice_buf_printf(out, "%" PRIu64, us);
        return SLUICE_OK;
    }
    int64_t ia, ib, is;
    if (sluice_json_i64(a, &ia) || sluice_json_i64(b, &ib)) return SLUICE_ERR;
    if (__builtin_add_overflow(ia, ib, &is)) return sluice_error("i64 overflow");
    sluice_buf_printf(out, "%" PRId64, is);
    return SLUICE_OK;
}

/* `name 0x00 key` in `b` (cleared first): the timer key of a key's
 * sessions (and of a tumbling or hopping window stored by an earlier SDK). */
static void window_timer_key(sluice_buf_t *b, const char *name, sluice_bytes_t key) {
    sluice_buf_clear(b);
    sluice_buf_append_str(b, name);
    buf_byte(b, 0);
    sluice_buf_append(b, key.ptr, key.len);
}

/* The record key a timer `name 0x00 key` of windows named `name` is for, if
 * it is one. */
static bool timer_record_key(const char *name, const sluice_timer_t *t, sluice_bytes_t *key) {
    size_t n = strlen(name);
    if (t->clock != SLUICE_CLOCK_EVENT || t->key.len < n + 1 || memcmp(t->key.ptr, name, n) != 0 || t->key.ptr[n] != 0)
        return false;
    *key = sluice_bytes(t->key.ptr + n + 1, t->key.len - n - 1);
    return true;
}

static int timestamp_of(const sluice_record_t *r, int64_t *ts) {
    if (!sluice_record_timestamp(r, ts))
        return sluice_error("record %.*s-%" PRId32 "@%" PRId64 " has no timestamp, so it falls in no event-time window",
                            (int)r->topic.len, (const char *)r->topic.ptr, r->partition, r->offset);
    return SLUICE_OK;
}

static int check_windows(const sluice_windows_t *w) {
    if (check_name(w->name)) return SLUICE_ERR;
    if (w->size_ms <= 0 || w->slide_ms <= 0 || w->slide_ms > w->size_ms)
        return sluice_error("windows `%s`: the size and slide must be positive, and the slide at most the size", w->name);
    if (w->lateness_ms < 0)
        return sluice_error("windows `%s`: the allowed lateness must not be negative (got %" PRId64 ")", w->name,
                            w->lateness_ms);
    return SLUICE_OK;
}

static int64_t windows_fires_at(const sluice_windows_t *w, int64_t start) {
    return sat_add(sat_sub(sat_add(start, w->size_ms), 1), w->lateness_ms);
}

/* The start of the window whose timer is set for `at`. */
static int64_t windows_start_of(const sluice_windows_t *w, int64_t at) {
    return sat_sub(sat_add(sat_sub(at, w->lateness_ms), 1), w->size_ms);
}

/* Runs `fold` into `out` (cleared) and checks it wrote JSON. */
static int run_fold(const char *kind, const char *name, sluice_fold_fn fold, const sluice_bytes_t *acc, sluice_buf_t *out,
                    void *ctx) {
    sluice_buf_clear(out);
    if (fold(acc, out, ctx) != SLUICE_OK) return SLUICE_ERR;
    if (!sluice_json_valid(sluice_buf_bytes(out))) return sluice_error("%s `%s`: the fold wrote invalid JSON", kind, name);
    return SLUICE_OK;
}

/* Window `start` of key `k` is the map-state entry (`name`, `start` as an
 * i64 map key's 8 bytes, `k` as the map key), `name 0x00 u32_be(8)
 * i64(start) k`: one window's accumulators are the entries of one key range,
 * which its one timer (key `name`) closes. */
int sluice_windows_add(const sluice_windows_t *w, sluice_bytes_t key, int64_t ts, sluice_fold_fn fold, void *ctx,
                       size_t *added) {
    if (added) *added = 0;
    if (check_windows(w)) return SLUICE_ERR;
    sluice_map_state_t state = {w->name, 0};
    int64_t wm;
    bool has_wm = sluice_watermark(&wm);
    int64_t start = sat_mul(floor_div(ts, w->slide_ms), w->slide_ms);
    int64_t floor = sat_sub(ts, w->size_ms);
    sluice_buf_t acc = {0};
    int rc = SLUICE_OK;
    size_t n = 0;
    while (start > floor) {
        int64_t fires_at = windows_fires_at(w, start);
        if (!has_wm || fires_at > wm) {
            uint8_t wb[8];
            sluice_bytes_t window = sluice_map_key_i64(start, wb), cur;
            bool found;
            if ((rc = sluice_map_get_json(&state, window, key, &cur, &found))) break;
            if ((rc = run_fold("windows", w->name, fold, found ? &cur : NULL, &acc, ctx))) break;
            if ((rc = map_put(&state, window, key, sluice_buf_bytes(&acc)))) break;
            /* One timer per window end, whatever the keys: set with a
             * window's first accumulator (once per call), and firing it
             * closes every key's window of that start. */
            if (!found && (rc = timer_set_once_per_call(SLUICE_CLOCK_EVENT, sluice_str(w->name), fires_at))) break;
            n++;
        }
        start = sat_sub(start, w->slide_ms);
    }
    sluice_buf_free(&acc);
    if (added) *added = n;
    return rc;
}

int sluice_windows_add_record(const sluice_windows_t *w, const sluice_record_t *r, sluice_fold_fn fold, void *ctx,
                              size_t *added) {
    int64_t ts;
    if (added) *added = 0;
    if (timestamp_of(r, &ts)) return SLUICE_ERR;
    return sluice_windows_add(w, sluice_record_key_or_empty(r), ts, fold, ctx, added);
}

/* Closed windows handed out until the end of the hook call: one arena block
 * with the array, then every key's and value's bytes. */
typedef struct closed {
    sluice_window_t *windows;
    size_t len;
    uint8_t *bytes; /* where the next key or value goes */
} closed_t;

static void closed_alloc(closed_t *c, size_t n, size_t bytes) {
    c->windows = arena_keep(xmalloc(n * sizeof *c->windows + bytes));
    c->len = 0;
    c->bytes = (uint8_t *)(c->windows + n);
}

static sluice_bytes_t closed_copy(closed_t *c, sluice_bytes_t b) {
    sluice_bytes_t copy = sluice_bytes(c->bytes, b.len);
    if (b.len) memcpy(c->bytes, b.ptr, b.len);
    c->bytes += b.len;
    return copy;
}

static void closed_push(closed_t *c, sluice_bytes_t key, int64_t start, int64_t end, sluice_bytes_t value) {
    sluice_window_t *win = &c->windows[c->len++];
    win->key = closed_copy(c, key);
    win->start = start;
    win->end = end;
    win->value = closed_copy(c, value);
}

/* The byte after the name in the key of the timer that goes on with a window
 * end's windows after the last key a firing closed (`name 0x01 key`);
 * distinct from the `name 0x00 key` of per-key timers. */
#define WINDOWS_CONTINUED 0x01

/* A timer `name 0x00 key` of a window that an earlier SDK stored per key
 * (the map-state entry (`name`, key, start as an i64 map key)): closes that
 * window alone, so that windows open across an upgrade are not lost. */
static int windows_fire_stored_per_key(const sluice_windows_t *w, const sluice_timer_t *timer,
                                       const sluice_window_t **windows, size_t *n) {
    sluice_bytes_t key;
    if (!timer_record_key(w->name, timer, &key)) return SLUICE_OK;
    int64_t start = windows_start_of(w, timer->at);
    sluice_map_state_t state = {w->name, 0};
    uint8_t mkb[8];
    sluice_bytes_t mk = sluice_map_key_i64(start, mkb), value;
    bool found;
    if (sluice_map_get_json(&state, key, mk, &value, &found)) return SLUICE_ERR;
    if (!found) return SLUICE_OK;
    closed_t c;
    closed_alloc(&c, 1, key.len + value.len);
    closed_push(&c, key, start, sat_add(start, w->size_ms), value);
    if (sluice_map_remove(&state, key, mk)) return SLUICE_ERR;
    *windows = c.windows;
    *n = c.len;
    return SLUICE_OK;
}

int sluice_windows_fire(const sluice_windows_t *w, const sluice_timer_t *timer, const sluice_window_t **windows,
                        size_t *n) {
    *windows = NULL;
    *n = 0;
    if (check_windows(w)) return SLUICE_ERR;
    if (timer->clock != SLUICE_CLOCK_EVENT) return SLUICE_OK;
    /* The window end's timer (`name`), or the one that goes on after the key
     * the previous firing of that end stopped at (`name 0x01 last-key`). */
    size_t name_len = strlen(w->name);
    if (timer->key.len < name_len || (name_len && memcmp(timer->key.ptr, w->name, name_len) != 0))
        return windows_fire_stored_per_key(w, timer, windows, n);
    bool resume = timer->key.len > name_len;
    if (resume && timer->key.ptr[name_len] != WINDOWS_CONTINUED)
        return windows_fire_stored_per_key(w, timer, windows, n);
    int64_t start = windows_start_of(w, timer->at), end = sat_add(start, w->size_ms);
    uint8_t wb[8], *prefix;
    size_t plen;
    if (map_key(w->name, sluice_map_key_i64(start, wb), NULL, &prefix, &plen)) return SLUICE_ERR;
    /* From after the last key fired, not from the range's start: the windows
     * fired before are deletions there until the checkpoint folds them, and
     * passing over them again, page after page, would cost a window end with
     * n keys O(n^2 / 64). */
    sluice_buf_t after = {0};
    if (resume) {
        sluice_buf_append(&after, prefix, plen);
        sluice_buf_append(&after, timer->key.ptr + name_len + 1, timer->key.len - name_len - 1);
    }
    cache_flush(); /* the host sees this call's writes (an earlier firing's removals too) */
    packed_out_list_u8_t p = {prefix, plen}, a = {after.ptr, after.len};
    packed_out_list_tuple2_list_u8_list_u8_t page = {NULL, 0};
    sluice_transform_state_scan_prefix(&p, resume ? &a : NULL, SLUICE_WINDOWS_PER_FIRING + 1, &page);
    sluice_buf_free(&after);
    size_t take = page.len < SLUICE_WINDOWS_PER_FIRING ? page.len : SLUICE_WINDOWS_PER_FIRING, bytes = 0;
    int rc = SLUICE_OK;
    for (size_t i = 0; i < take && rc == SLUICE_OK; i++) {
        const packed_out_list_u8_t *k = &page.ptr[i].f0, *v = &page.ptr[i].f1;
        if (k->len < plen || memcmp(k->ptr, prefix, plen) != 0)
            rc = sluice_error("host bug: state.scan-prefix returned a key outside the prefix (windows `%s`)", w->name);
        else if (!sluice_json_valid(sluice_bytes(v->ptr ? v->ptr : (const uint8_t *)"", v->len)))
            rc = sluice_error("state `%s`: invalid JSON", w->name);
        else
            bytes += k->len - plen + v->len;
    }
    if (rc == SLUICE_OK && take) {
        closed_t c;
        closed_alloc(&c, take, bytes);
        for (size_t i = 0; i < take; i++) {
            const packed_out_list_u8_t *k = &page.ptr[i].f0, *v = &page.ptr[i].f1;
            closed_push(&c, sluice_bytes(k->ptr + plen, k->len - plen), start, end,
                        sluice_bytes(v->ptr ? v->ptr : (const uint8_t *)"", v->len));
            cache_write(k->ptr, k->len, NULL, 0);
        }
        /* The rest of the range fires in the host's next round, from a timer
         * at the same time that goes on after the last key closed here. */
        if (page.len > SLUICE_WINDOWS_PER_FIRING) {
            const sluice_window_t *last = &c.windows[c.len - 1];
            sluice_buf_t key = {0};
            sluice_buf_append_str(&key, w->name);
            buf_byte(&key, WINDOWS_CONTINUED);
            sluice_buf_append(&key, last->key.ptr, last->key.len);
            rc = sluice_timer_set(SLUICE_CLOCK_EVENT, sluice_bytes(key.ptr, key.len), timer->at);
            sluice_buf_free(&key);
        }
        if (rc == SLUICE_OK) {
            *windows = c.windows;
            *n = c.len;
        }
    }
    packed_out_list_tuple2_list_u8_list_u8_free(&page);
    free(prefix);
    return rc;
}

/* One open session, its value a view (into the stored JSON or a buffer). */
typedef struct session {
    int64_t start, end;
    sluice_bytes_t value;
} session_t;

typedef struct sessions_vec {
    session_t *ptr;
    size_t len, cap;
} sessions_vec_t;

static void sessions_push(sessions_vec_t *v, session_t s) {
    if (v->len == v->cap) {
        v->cap = v->cap ? v->cap * 2 : 8;
        v->ptr = xrealloc(v->ptr, v->cap * sizeof *v->ptr);
    }
    v->ptr[v->len++] = s;
}

static int sessions_invalid(const char *name) {
    return sluice_error("state `%s`: invalid JSON: expected an array of {\"start\", \"end\", \"value\"}", name);
}

/* Parses the stored sessions `json` into `out` (views into `json`). */
static int sessions_parse(const char *name, sluice_bytes_t json, sessions_vec_t *out) {
    if (!sluice_json_valid(json)) return sluice_error("state `%s`: invalid JSON", name);
    jcur_t c = {json.ptr, json.len, 0};
    j_ws(&c);
    if (c.p[c.i] != '[') return sessions_invalid(name);
    c.i++;
    j_ws(&c);
    if (c.p[c.i] == ']') return SLUICE_OK;
    for (;;) {
        if (c.p[c.i] != '{') return sessions_invalid(name);
        c.i++;
        j_ws(&c);
        session_t s = {0, 0, {NULL, 0}};
        bool has_start = false, has_end = false, has_value = false;
        while (c.p[c.i] != '}') {
            const uint8_t *k;
            size_t klen;
            j_string(&c, &k, &klen);
            j_ws(&c);
            c.i++; /* ':' */
            j_ws(&c);
            size_t vs = c.i;
            j_value(&c, 2);
            sluice_bytes_t v = sluice_bytes(c.p + vs, c.i - vs);
            if (klen == 5 && memcmp(k, "start", 5) == 0) {
                if (!json_to_i64(v, &s.start)) return sessions_invalid(name);
                has_start = true;
            } else if (klen == 3 && memcmp(k, "end", 3) == 0) {
                if (!json_to_i64(v, &s.end)) return sessions_invalid(name);
                has_end = true;
            } else if (klen == 5 && memcmp(k, "value", 5) == 0) {
                s.value = v;
                has_value = true;
            }
            j_ws(&c);
            if (c.p[c.i] == ',') {
                c.i++;
                j_ws(&c);
            }
        }
        c.i++; /* '}' */
        if (!has_start || !has_end || !has_value) return sessions_invalid(name);
        sessions_push(out, s);
        j_ws(&c);
        if (c.p[c.i] == ']') return SLUICE_OK;
        c.i++; /* ',' */
        j_ws(&c);
    }
}

static void sessions_encode(sluice_buf_t *b, const sessions_vec_t *v) {
    buf_byte(b, '[');
    for (size_t i = 0; i < v->len; i++) {
        if (i) buf_byte(b, ',');
        sluice_buf_printf(b, "{\"start\":%" PRId64 ",\"end\":%" PRId64 ",\"value\":", v->ptr[i].start, v->ptr[i].end);
        sluice_buf_append(b, v->ptr[i].value.ptr, v->ptr[i].value.len);
        buf_byte(b, '}');
    }
    buf_byte(b, ']');
}

static int check_sessions(const sluice_sessions_t *s) {
    if (check_name(s->name)) return SLUICE_ERR;
    if (s->gap_ms <= 0) return sluice_error("sessions `%s`: the gap must be positive", s->name);
    if (s->lateness_ms < 0)
        return sluice_error("sessions `%s`: the allowed lateness must not be negative (got %" PRId64 ")", s->name,
                            s->lateness_ms);
    return SLUICE_OK;
}

static int64_t sessions_fires_at(const sluice_sessions_t *s, int64_t end) {
    return sat_add(sat_sub(end, 1), s->lateness_ms);
}

/* A private copy of the key's stored sessions JSON (empty when none), so
 * callbacks that touch state cannot pull it from under the parsed views. */
static int sessions_load(const sluice_sessions_t *s, sluice_bytes_t key, sluice_buf_t *raw, sessions_vec_t *v) {
    sluice_value_state_t state = {s->name, 0};
    sluice_bytes_t json;
    bool found;
    if (sluice_value_get_json(&state, key, &json, &found)) return SLUICE_ERR;
    if (!found) return SLUICE_OK;
    sluice_buf_append(raw, json.ptr, json.len);
    return sessions_parse(s->name, sluice_buf_bytes(raw), v);
}

int sluice_sessions_add(const sluice_sessions_t *s, sluice_bytes_t key, int64_t ts, sluice_fold_fn fold,
                        sluice_merge_fn merge, void *ctx, bool *added) {
    if (added) *added = false;
    if (check_sessions(s)) return SLUICE_ERR;
    int64_t start = ts, end = sat_add(ts, s->gap_ms), wm;
    if (sluice_watermark(&wm) && sessions_fires_at(s, end) <= wm) return SLUICE_OK;
    sluice_buf_t raw = {0}, tk = {0}, merged_value = {0}, tmp = {0}, acc = {0}, encoded = {0};
    sessions_vec_t all = {0}, rest = {0};
    int rc = sessions_load(s, key, &raw, &all);
    window_timer_key(&tk, s->name, key);
    bool have_merged = false;
    session_t merged = {0, 0, {NULL, 0}};
    for (size_t i = 0; i < all.len && rc == SLUICE_OK; i++) {
        session_t x = all.ptr[i];
        if (!(x.start < end && start < x.end)) {
            sessions_push(&rest, x);
            continue;
        }
        if ((rc = sluice_timer_delete(SLUICE_CLOCK_EVENT, sluice_buf_bytes(&tk), sessions_fires_at(s, x.end)))) break;
        if (!have_merged) {
            merged = x;
            sluice_buf_append(&merged_value, x.value.ptr, x.value.len);
            have_merged = true;
            continue;
        }
        sluice_buf_clear(&tmp);
        if ((rc = merge(sluice_buf_bytes(&merged_value), x.value, &tmp, ctx))) break;
        if (!sluice_json_valid(sluice_buf_bytes(&tmp))) {
            rc = sluice_error("sessions `%s`: the merge wrote invalid JSON", s->name);
            break;
        }
        sluice_buf_t swap = merged_value;
        merged_value = tmp;
        tmp = swap;
        merged.start = merged.start < x.start ? merged.start : x.start;
        merged.end = merged.end > x.end ? merged.end : x.end;
    }
    if (rc == SLUICE_OK) {
        session_t session;
        if (!have_merged) {
            rc = run_fold("sessions", s->name, fold, NULL, &acc, ctx);
            session = (session_t){start, end, sluice_buf_bytes(&acc)};
        } else {
            sluice_bytes_t cur = sluice_buf_bytes(&merged_value);
            rc = run_fold("sessions", s->name, fold, &cur, &acc, ctx);
            session = (session_t){merged.start < start ? merged.start : start, merged.end > end ? merged.end : end,
                                  sluice_buf_bytes(&acc)};
        }
        if (rc == SLUICE_OK) rc = sluice_timer_set(SLUICE_CLOCK_EVENT, sluice_buf_bytes(&tk), sessions_fires_at(s, session.end));
        if (rc == SLUICE_OK) {
            /* Insert keeping start order, after equal starts (a stable sort). */
            sessions_push(&rest, session);
            size_t i = rest.len - 1;
            while (i > 0 && rest.ptr[i - 1].start > session.start) {
                rest.ptr[i] = rest.ptr[i - 1];
                i--;
            }
            rest.ptr[i] = session;
            sessions_encode(&encoded, &rest);
            sluice_value_state_t state = {s->name, 0};
            rc = value_put(&state, key, sluice_buf_bytes(&encoded));
            if (rc == SLUICE_OK && added) *added = true;
        }
    }
    sluice_buf_free(&raw);
    sluice_buf_free(&tk);
    sluice_buf_free(&merged_value);
    sluice_buf_free(&tmp);
    sluice_buf_free(&acc);
    sluice_buf_free(&encoded);
    free(all.ptr);
    free(rest.ptr);
    return rc;
}

int sluice_sessions_add_record(const sluice_sessions_t *s, const sluice_record_t *r, sluice_fold_fn fold,
                               sluice_merge_fn merge, void *ctx, bool *added) {
    int64_t ts;
    if (added) *added = false;
    if (timestamp_of(r, &ts)) return SLUICE_ERR;
    return sluice_sessions_add(s, sluice_record_key_or_empty(r), ts, fold, merge, ctx, added);
}

int sluice_sessions_fire(const sluice_sessions_t *s, const sluice_timer_t *timer, sluice_window_t *window, bool *fired) {
    *fired = false;
    if (check_sessions(s)) return SLUICE_ERR;
    sluice_bytes_t key;
    if (!timer_record_key(s->name, timer, &key)) return SLUICE_OK;
    sluice_buf_t raw = {0}, encoded = {0};
    sessions_vec_t all = {0}, open = {0};
    int rc = sessions_load(s, key, &raw, &all);
    bool have_closed = false;
    session_t closed = {0, 0, {NULL, 0}};
    for (size_t i = 0; i < all.len && rc == SLUICE_OK; i++) {
        if (sessions_fires_at(s, all.ptr[i].end) == timer->at) {
            if (!have_closed) closed = all.ptr[i];
            have_closed = true;
        } else {
            sessions_push(&open, all.ptr[i]);
        }
    }
    if (rc == SLUICE_OK && have_closed) {
        uint8_t *copy = arena_keep(xmalloc(closed.value.len));
        memcpy(copy, closed.value.ptr, closed.value.len);
        sluice_value_state_t state = {s->name, 0};
        if (open.len) {
            sessions_encode(&encoded, &open);
            rc = value_put(&state, key, sluice_buf_bytes(&encoded));
        } else {
            rc = sluice_value_clear(&state, key);
        }
        if (rc == SLUICE_OK) {
            window->key = key;
            window->start = closed.start;
            window->end = closed.end;
            window->value = sluice_bytes(copy, closed.value.len);
            *fired = true;
        }
    }
    sluice_buf_free(&raw);
    sluice_buf_free(&encoded);
    free(all.ptr);
    free(open.ptr);
    return rc;
}

/* ---- logging ----------------------------------------------------------- */

void sluice_log(sluice_level_t level, const char *fmt, ...) {
    sluice_buf_t b = {0};
    va_list args;
    va_start(args, fmt);
    buf_vprintf(&b, fmt, args);
    va_end(args);
    packed_out_string_t msg = {b.ptr ? b.ptr : (uint8_t *)"", b.len};
    sluice_transform_log_log((sluice_transform_log_level_t)level, &msg);
    sluice_buf_free(&b);
}

/* ---- the exports ------------------------------------------------------- */

__attribute__((weak)) int sluice_transform_begin_batch(const sluice_batch_t *batch) {
    (void)batch;
    return SLUICE_OK;
}

__attribute__((weak)) int sluice_transform_end_batch(sluice_emitter_t *out) {
    (void)out;
    return SLUICE_OK;
}

__attribute__((weak)) int sluice_transform_on_timer(const sluice_timer_t *timer, sluice_emitter_t *out) {
    (void)timer;
    (void)out;
    return sluice_error("a timer fired, but the transform defines no on-timer hook: implement "
                        "`int sluice_transform_on_timer(const sluice_timer_t *, sluice_emitter_t *)` to handle "
                        "the timers it sets (windows need it too)");
}

__attribute__((weak)) int sluice_transform_migrate(sluice_bytes_t from_module) {
    (void)from_module;
    return SLUICE_OK;
}

static bool initialized;

/* Starts an export call (its cache is the caller's: `cache_begin`). */
static void call_begin(bool shard) {
    watermark_asked = now_asked = false;
    call_set_clear();
    in_shard = shard;
}

static void call_end(void) {
    arena_free();
    call_set_clear();
    in_shard = false;
}

#ifdef SLUICE_NATIVE_TESTS
/* For sdks/c/tests: run SDK calls outside an export, as inside one (a shard
 * call), and end it as an export would (state written back). */
void sluice_testing_call_begin(void) {
    cache_begin(false, 0);
    call_begin(true);
}
void sluice_testing_call_finish(void) {
    cache_finish();
    call_end();
}

static size_t tables_size(const slot_t *table, size_t cap) {
    size_t n = 0;
    for (size_t i = 0; i < cap; i++)
        if (table[i].key) n += ENTRY_BYTES + table[i].key_len + table[i].value_len;
    return n;
}

static size_t blocks_size(const bytes_block_t *b) {
    size_t n = 0;
    for (; b; b = b->next) n += sizeof *b + b->cap;
    return n;
}

/* Whether the sizes the cache and each parked shard counted as they went
 * are what their entries and byte blocks hold. */
bool sluice_testing_sizes_add_up(void) {
    size_t total = 0;
    for (size_t i = 0; i < parked_len; i++) {
        parked_t *p = &parked[i];
        if (p->size != tables_size(p->slots, p->slot_cap) || p->blocks_bytes != blocks_size(p->cache_bytes)) return false;
        total += parked_footprint(p);
    }
    return total == parked_size && cache_size == tables_size(slots, slot_cap) &&
           cache_blocks_bytes == blocks_size(cache_bytes);
}

/* What the cache and the parked shards take, as counted against `max-bytes`. */
size_t sluice_testing_held_bytes(void) { return cache_footprint() + parked_size; }
#endif

bool exports_packed_out_init(packed_out_list_tuple2_string_string_t *config, packed_out_string_t *err) {
    sluice_config_t cfg = {config};
    cache_drop_all();
    max_held = 0; /* until `hold-state`, which follows `init` */
    call_begin(false);
    int rc = sluice_transform_init(&cfg);
    packed_out_list_tuple2_string_string_free(config);
    if (rc != SLUICE_OK) {
        cache_drop_all();
        call_end();
        take_error(err, "", 0);
        return false;
    }
    cache_finish(); /* state touched in init is written back now, and the host refuses it: state belongs to an input partition */
    call_end();
    initialized = true;
    return true;
}

static bool not_initialized(const char *what, packed_out_string_t *err) {
    sluice_error("%s called before init", what);
    take_error(err, "", 0);
    return false;
}

/* Runs the hooks over one batch; its outputs, packed, go to *outputs (or
 * the error that failed it to *err). The batch stays the caller's. With
 * `may_hold` (a packed call), the state of the batch's shard (its
 * partition) may stay cached after it. */
static bool run_batch(sluice_batch_t b, bool may_hold, sluice_buf_t *outputs, packed_out_string_t *err) {
    sluice_emitter_t out;
    char prefix[160];
    int rc;
    emitter_begin(&out);
    bool has_shard = may_hold && b.len > 0 && b.records[0].partition >= 0;
    cache_begin(has_shard, has_shard ? (uint32_t)b.records[0].partition : 0);
    call_begin(true);
    if ((rc = sluice_transform_begin_batch(&b)) != SLUICE_OK) {
        snprintf(prefix, sizeof prefix, "begin_batch: ");
    } else {
        for (size_t i = 0; i < b.len && rc == SLUICE_OK; i++) {
            const sluice_record_t *r = &b.records[i];
            if ((rc = sluice_transform_process(r, &out)) != SLUICE_OK) {
                snprintf(prefix, sizeof prefix, "record %.*s-%" PRId32 "@%" PRId64 ": ", (int)r->topic.len,
                         (const char *)r->topic.ptr, r->partition, r->offset);
            }
        }
        if (rc == SLUICE_OK && (rc = sluice_transform_end_batch(&out)) != SLUICE_OK) {
            snprintf(prefix, sizeof prefix, "end_batch: ");
        }
    }
    if (rc != SLUICE_OK) {
        cache_drop_all();
        sluice_buf_free(&out.packed);
        call_end();
        take_error(err, prefix, strlen(prefix));
        return false;
    }
    cache_end();
    call_end();
    *outputs = emitter_finish(&out);
    return true;
}

bool exports_packed_out_process(packed_out_list_input_record_t *batch, packed_out_list_output_record_t *ret, packed_out_string_t *err) {
    sluice_buf_t outputs;
    bool ok = initialized ? run_batch((sluice_batch_t){batch->ptr, batch->len}, false, &outputs, err)
                          : not_initialized("process", err);
    packed_out_list_input_record_free(batch);
    if (ok) *ret = outputs_list(outputs);
    return ok;
}

/* A packed batch's records, topics and headers, read in place: views into
 * the batch's one byte string, in arrays kept from batch to batch. */
static sluice_record_t *unpacked_records;
static size_t unpacked_records_cap;
static packed_out_string_t *unpacked_topics;
static size_t unpacked_topics_cap;
static sluice_transform_types_header_t *unpacked_headers;
static size_t unpacked_headers_cap;

static void *fit(void *array, size_t *cap, size_t need, size_t size) {
    if (need <= *cap) return array;
    size_t grown = *cap ? *cap : 16;
    while (grown < need) grown *= 2;
    *cap = grown;
    return xrealloc(array, grown * size);
}

/* Reads the `packed-batch` layout of wit/sluice.wit into a batch of views.
 * Counts are checked against the bytes left before anything is sized by
 * them, so a malformed string cannot make the guest allocate wildly. */
static bool unpack_batch(const uint8_t *ptr, size_t len, sluice_batch_t *batch) {
    unpacker_t u = {ptr, ptr + len, false};
    int32_t partition = (int32_t)un_u32(&u);
    uint32_t topics = un_u32(&u);
    if (topics > (size_t)(u.end - u.at) / 4) return false;
    unpacked_topics = fit(unpacked_topics, &unpacked_topics_cap, topics, sizeof *unpacked_topics);
    for (uint32_t t = 0; t < topics; t++) {
        packed_out_list_u8_t name = un_bytes(&u);
        unpacked_topics[t] = (packed_out_string_t){name.ptr, name.len};
    }
    uint32_t records = un_u32(&u);
    /* A record is at least 17 bytes: flags, topic, offset, header count. */
    if (u.bad || records > (size_t)(u.end - u.at) / 17) return false;
    unpacked_records = fit(unpacked_records, &unpacked_records_cap, records, sizeof *unpacked_records);
    size_t headers = 0;
    for (uint32_t i = 0; i < records && !u.bad; i++) {
        sluice_record_t *r = &unpacked_records[i];
        uint8_t flags = un_u8(&u);
        uint32_t topic = un_u32(&u);
        if (topic >= topics) return false;
        r->topic = unpacked_topics[topic];
        r->partition = partition;
        r->offset = un_s64(&u);
        r->timestamp.is_some = flags & 4;
        r->timestamp.val = (flags & 4) ? un_s64(&u) : 0;
        r->key.is_some = flags & 1;
        r->key.val = (flags & 1) ? un_bytes(&u) : (packed_out_list_u8_t){NULL, 0};
        r->value.is_some = flags & 2;
        r->value.val = (flags & 2) ? un_bytes(&u) : (packed_out_list_u8_t){NULL, 0};
        uint32_t n = un_u32(&u);
        if (n > (size_t)(u.end - u.at) / 8) return false;
        unpacked_headers = fit(unpacked_headers, &unpacked_headers_cap, headers + n, sizeof *unpacked_headers);
        for (uint32_t h = 0; h < n; h++) {
            packed_out_list_u8_t name = un_bytes(&u);
            unpacked_headers[headers + h].key = (packed_out_string_t){name.ptr, name.len};
            unpacked_headers[headers + h].value = un_bytes(&u);
        }
        r->headers.len = n;
        headers += n;
    }
    if (u.bad || u.at != u.end) return false;
    /* The header array may have moved while it grew: point into it now. */
    size_t at = 0;
    for (uint32_t i = 0; i < records; i++) {
        sluice_record_t *r = &unpacked_records[i];
        r->headers.ptr = r->headers.len ? &unpacked_headers[at] : NULL;
        at += r->headers.len;
    }
    batch->records = unpacked_records;
    batch->len = records;
    return true;
}

/* A packed batch through the hooks, its outputs packed. */
static bool run_packed_batch(packed_out_packed_batch_t *batch, sluice_buf_t *outputs, packed_out_string_t *err) {
    bool ok;
    sluice_batch_t b;
    if (!initialized) {
        ok = not_initialized("process", err);
    } else if (!unpack_batch(batch->ptr, batch->len, &b)) {
        sluice_error("host bug: a malformed packed batch (%zu bytes)", batch->len);
        take_error(err, "", 0);
        ok = false;
    } else {
        ok = run_batch(b, true, outputs, err);
    }
    packed_out_packed_batch_free(batch);
    return ok;
}

bool exports_packed_out_process_packed(packed_out_packed_batch_t *batch, packed_out_list_output_record_t *ret,
                                       packed_out_string_t *err) {
    sluice_buf_t outputs;
    if (!run_packed_batch(batch, &outputs, err)) return false;
    *ret = outputs_list(outputs);
    return true;
}

bool exports_packed_out_process_packed_out(packed_out_packed_batch_t *batch, packed_out_packed_outputs_t *ret,
                                           packed_out_string_t *err) {
    sluice_buf_t outputs;
    if (!run_packed_batch(batch, &outputs, err)) return false;
    /* Never empty (it holds the count), so the post-return function frees it. */
    ret->ptr = outputs.ptr;
    ret->len = outputs.len;
    return true;
}

/* The host will ask for held state back (see `cache_begin`). */
void exports_packed_out_hold_state(uint64_t max_bytes) { max_held = max_bytes > SIZE_MAX ? SIZE_MAX : (size_t)max_bytes; }

/* Writes back what is held of `shard` (one `state.write-packed`, which
 * cannot fail: a refused write traps). */
bool exports_packed_out_flush_state(uint32_t shard, packed_out_string_t *err) {
    (void)err;
    cache_give_back(shard);
    return true;
}

/* `b` as Rust's `{:?}` shows `String::from_utf8_lossy(b)` (as the Python
 * SDK approximates it): in quotes, with `"`, `\`, NUL, tab, CR, LF and other
 * control characters escaped, invalid UTF-8 as U+FFFD. */
static void append_debug_str(sluice_buf_t *out, sluice_bytes_t b) {
    buf_byte(out, '"');
    size_t i = 0;
    while (i < b.len) {
        uint8_t c0 = b.ptr[i];
        uint32_t cp;
        size_t need = 0, j = 1;
        uint8_t lo = 0x80, hi = 0xbf;
        if (c0 < 0x80) {
            cp = c0;
        } else {
            if (c0 >= 0xc2 && c0 <= 0xdf) need = 1;
            else if (c0 == 0xe0) need = 2, lo = 0xa0;
            else if (c0 >= 0xe1 && c0 <= 0xec) need = 2;
            else if (c0 == 0xed) need = 2, hi = 0x9f;
            else if (c0 >= 0xee && c0 <= 0xef) need = 2;
            else if (c0 == 0xf0) need = 3, lo = 0x90;
            else if (c0 >= 0xf1 && c0 <= 0xf3) need = 3;
            else if (c0 == 0xf4) need = 3, hi = 0x8f;
            cp = need == 1 ? (c0 & 0x1f) : need == 2 ? (c0 & 0x0f) : (c0 & 0x07);
            bool ok = need > 0;
            for (; ok && j <= need; j++) {
                if (i + j >= b.len) {
                    ok = false;
                    break;
                }
                uint8_t cj = b.ptr[i + j];
                if (cj < (j == 1 ? lo : 0x80) || cj > (j == 1 ? hi : 0xbf)) {
                    ok = false;
                    break;
                }
                cp = (cp << 6) | (cj & 0x3f);
            }
            if (!ok) {
                sluice_buf_append(out, "\xef\xbf\xbd", 3);
                i += j; /* the maximal invalid subpart */
                continue;
            }
        }
        size_t len = need + 1;
        if (cp == '"' || cp == '\\') {
            buf_byte(out, '\\');
            buf_byte(out, (uint8_t)cp);
        } else if (cp == 0) {
            sluice_buf_append_str(out, "\\0");
        } else if (cp == '\t') {
            sluice_buf_append_str(out, "\\t");
        } else if (cp == '\r') {
            sluice_buf_append_str(out, "\\r");
        } else if (cp == '\n') {
            sluice_buf_append_str(out, "\\n");
        } else if (cp < 0x20 || (cp >= 0x7f && cp < 0xa0)) {
            sluice_buf_printf(out, "\\u{%x}", cp);
        } else {
            sluice_buf_append(out, b.ptr + i, len);
        }
        i += len;
    }
    buf_byte(out, '"');
}

bool exports_packed_out_on_timers(packed_out_list_timer_t *fired, packed_out_list_output_record_t *ret, packed_out_string_t *err) {
    if (!initialized) {
        packed_out_list_timer_free(fired);
        return not_initialized("on-timers", err);
    }
    sluice_emitter_t out;
    sluice_buf_t prefix = {0};
    int rc = SLUICE_OK;
    emitter_begin(&out);
    cache_begin(false, 0);
    call_begin(true);
    for (size_t i = 0; i < fired->len && rc == SLUICE_OK; i++) {
        const packed_out_timer_t *w = &fired->ptr[i];
        sluice_timer_t t = {(sluice_clock_t)w->clock, {w->key.ptr ? w->key.ptr : (const uint8_t *)"", w->key.len}, w->at};
        if (ttl_expire(&t)) continue; /* the SDK's own time-to-live timers */
        if ((rc = sluice_transform_on_timer(&t, &out)) != SLUICE_OK) {
            sluice_buf_printf(&prefix, "timer %s ", t.clock == SLUICE_CLOCK_EVENT ? "Event" : "Processing");
            append_debug_str(&prefix, t.key);
            sluice_buf_printf(&prefix, "@%" PRId64 ": ", t.at);
        }
    }
    packed_out_list_timer_free(fired);
    if (rc != SLUICE_OK) {
        cache_drop_all();
        sluice_buf_free(&out.packed);
        call_end();
        take_error(err, (const char *)(prefix.ptr ? prefix.ptr : (uint8_t *)""), prefix.len);
        sluice_buf_free(&prefix);
        return false;
    }
    cache_finish();
    call_end();
    *ret = outputs_list(emitter_finish(&out));
    return true;
}

bool exports_packed_out_migrate(packed_out_string_t *from_module, packed_out_string_t *err) {
    if (!initialized) {
        packed_out_string_free(from_module);
        return not_initialized("migrate", err);
    }
    cache_begin(false, 0);
    call_begin(true);
    int rc = sluice_transform_migrate(sluice_bytes(from_module->ptr ? from_module->ptr : (const uint8_t *)"", from_module->len));
    packed_out_string_free(from_module);
    if (rc != SLUICE_OK) {
        cache_drop_all();
        call_end();
        take_error(err, "", 0);
        return false;
    }
    cache_finish();
    call_end();
    return true;
}
