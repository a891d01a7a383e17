/*
 * sluice.c: the C SDK's implementation (see sluice.h for the API).
 *
 * It implements the two exports that `wit-bindgen c` declares in
 * transform.h (`exports_transform_init`, `exports_transform_process`) on top
 * of the user's hooks, and owns the per-batch state cache. Ownership follows
 * the generated bindings: export arguments belong to us and are freed before
 * returning; the returned output list is freed by the generated post-return
 * function, so everything in it is malloc'd (and nothing of length 0 is).
 * Values that `state.get`/`get-many` return are malloc'd by cabi_realloc and
 * move into the cache as they are.
 */
#include "sluice.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

/* ---- errors ------------------------------------------------------------ */

static char *error_message; /* malloc'd; NULL when there is none */

int sluice_error(const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    int n = vsnprintf(NULL, 0, fmt, args);
    va_end(args);
    char *msg = malloc(n > 0 ? (size_t)n + 1 : 1);
    if (!msg) abort();
    va_start(args, fmt);
    vsnprintf(msg, n > 0 ? (size_t)n + 1 : 1, fmt, args);
    va_end(args);
    free(error_message);
    error_message = msg;
    return SLUICE_ERR;
}

/* Moves the current error, prefixed with `prefix`, into `out` (a WIT string
 * that the generated code frees after returning it). */
static void take_error(transform_string_t *out, const char *prefix) {
    const char *msg = error_message ? error_message : "failed (the hook returned an error without a message)";
    size_t plen = strlen(prefix), mlen = strlen(msg);
    uint8_t *buf = malloc(plen + mlen + 1);
    if (!buf) abort();
    memcpy(buf, prefix, plen);
    memcpy(buf + plen, msg, mlen);
    out->ptr = buf;
    out->len = plen + mlen;
    free(error_message);
    error_message = NULL;
}

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) abort();
    return p;
}

/* A malloc'd copy of `b`, or NULL when it is empty (the generated
 * post-return code frees only non-empty lists). */
static uint8_t *copy_bytes(const uint8_t *ptr, size_t len) {
    if (len == 0) return NULL;
    uint8_t *p = xmalloc(len);
    memcpy(p, ptr, len);
    return p;
}

/* ---- configuration ----------------------------------------------------- */

struct sluice_config {
    const transform_list_tuple2_string_string_t *entries;
};

bool sluice_config_get(const sluice_config_t *config, const char *name, sluice_bytes_t *value) {
    size_t nlen = strlen(name);
    bool found = false;
    for (size_t i = 0; i < config->entries->len; i++) {
        const transform_tuple2_string_string_t *e = &config->entries->ptr[i];
        if (e->f0.len == nlen && memcmp(e->f0.ptr, name, nlen) == 0) {
            value->ptr = e->f1.ptr;
            value->len = e->f1.len;
            found = true;
        }
    }
    return found;
}

/* ---- input records ----------------------------------------------------- */

bool sluice_record_has_key(const sluice_record_t *r) { return r->key.is_some; }

sluice_bytes_t sluice_record_key_or_empty(const sluice_record_t *r) {
    sluice_bytes_t b = {(const uint8_t *)"", 0};
    if (r->key.is_some) {
        b.ptr = r->key.val.ptr;
        b.len = r->key.val.len;
    }
    return b;
}

bool sluice_record_has_value(const sluice_record_t *r) { return r->value.is_some; }

sluice_bytes_t sluice_record_value_or_empty(const sluice_record_t *r) {
    sluice_bytes_t b = {(const uint8_t *)"", 0};
    if (r->value.is_some) {
        b.ptr = r->value.val.ptr;
        b.len = r->value.val.len;
    }
    return b;
}

bool sluice_record_header(const sluice_record_t *r, const char *name, sluice_bytes_t *value) {
    size_t nlen = strlen(name);
    for (size_t i = 0; i < r->headers.len; i++) {
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

sluice_bytes_t sluice_record_topic(const sluice_record_t *r) {
    sluice_bytes_t b = {r->topic.ptr, r->topic.len};
    return b;
}

/* ---- output records ---------------------------------------------------- */

struct sluice_emitter {
    transform_output_record_t *ptr;
    size_t len, cap;
};

static transform_output_record_t *emit_slot(sluice_emitter_t *out) {
    if (out->len == out->cap) {
        out->cap = out->cap ? out->cap * 2 : 16;
        out->ptr = realloc(out->ptr, out->cap * sizeof *out->ptr);
        if (!out->ptr) abort();
    }
    transform_output_record_t *o = &out->ptr[out->len++];
    memset(o, 0, sizeof *o);
    return o;
}

int sluice_emit_record(sluice_emitter_t *out, const sluice_bytes_t *key, const sluice_bytes_t *value,
                       const char *topic) {
    transform_output_record_t *o = emit_slot(out);
    if (key) {
        o->key.is_some = true;
        o->key.val.ptr = copy_bytes(key->ptr, key->len);
        o->key.val.len = key->len;
    }
    if (value) {
        o->value.is_some = true;
        o->value.val.ptr = copy_bytes(value->ptr, value->len);
        o->value.val.len = value->len;
    }
    if (topic) {
        size_t n = strlen(topic);
        o->topic.is_some = true;
        o->topic.val.ptr = copy_bytes((const uint8_t *)topic, n);
        o->topic.val.len = n;
    }
    return SLUICE_OK;
}

int sluice_emit(sluice_emitter_t *out, sluice_bytes_t key, sluice_bytes_t value) {
    return sluice_emit_record(out, &key, &value, NULL);
}

static void push_header(transform_output_record_t *o, const uint8_t *name, size_t nlen, sluice_bytes_t value) {
    size_t n = o->headers.len;
    o->headers.ptr = realloc(o->headers.ptr, (n + 1) * sizeof *o->headers.ptr);
    if (!o->headers.ptr) abort();
    sluice_transform_types_header_t *h = &o->headers.ptr[n];
    h->key.ptr = copy_bytes(name, nlen);
    h->key.len = nlen;
    h->value.ptr = copy_bytes(value.ptr, value.len);
    h->value.len = value.len;
    o->headers.len = n + 1;
}

int sluice_emit_header(sluice_emitter_t *out, const char *name, sluice_bytes_t value) {
    if (out->len == 0) return sluice_error("sluice_emit_header: no record emitted yet");
    push_header(&out->ptr[out->len - 1], (const uint8_t *)name, strlen(name), value);
    return SLUICE_OK;
}

int sluice_forward(sluice_emitter_t *out, const sluice_record_t *r) {
    sluice_bytes_t key = {r->key.val.ptr, r->key.val.len};
    sluice_bytes_t value = {r->value.val.ptr, r->value.val.len};
    sluice_emit_record(out, r->key.is_some ? &key : NULL, r->value.is_some ? &value : NULL, NULL);
    transform_output_record_t *o = &out->ptr[out->len - 1];
    for (size_t i = 0; i < r->headers.len; i++) {
        const sluice_transform_types_header_t *h = &r->headers.ptr[i];
        sluice_bytes_t v = {h->value.ptr, h->value.len};
        push_header(o, h->key.ptr, h->key.len, v);
    }
    return SLUICE_OK;
}

size_t sluice_emitted(const sluice_emitter_t *out) { return out->len; }

sluice_bytes_t sluice_u64_text(uint64_t n, char buf[21]) {
    int len = snprintf(buf, 21, "%" PRIu64, n);
    sluice_bytes_t b = {(const uint8_t *)buf, (size_t)len};
    return b;
}

/* ---- the per-batch state cache ----------------------------------------- */

/* One cached entry: the value as the batch sees it (`present` false: absent
 * or deleted) and whether the host has yet to hear about it. */
typedef struct slot {
    uint8_t *key; /* NULL: empty slot. State keys are never empty (name 0x00 ...). */
    size_t key_len;
    uint64_t hash;
    uint8_t *value; /* malloc'd or NULL */
    size_t value_len;
    bool present;
    bool dirty;
} slot_t;

static slot_t *slots;   /* open addressing, linear probing */
static size_t slot_cap; /* a power of two, or 0 */
static size_t slot_count;
static size_t *dirty;   /* slot indices in the order they became dirty */
static size_t dirty_len, dirty_cap;

static uint64_t fnv1a(const uint8_t *p, size_t n) {
    uint64_t h = 0xcbf29ce484222325u;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3u;
    return h;
}

static slot_t *cache_find(const uint8_t *key, size_t len, uint64_t hash) {
    if (!slot_cap) return NULL;
    for (size_t i = hash & (slot_cap - 1);; i = (i + 1) & (slot_cap - 1)) {
        slot_t *s = &slots[i];
        if (!s->key) return NULL;
        if (s->hash == hash && s->key_len == len && memcmp(s->key, key, len) == 0) return s;
    }
}

static void cache_grow(void) {
    size_t old_cap = slot_cap;
    slot_t *old = slots;
    slot_cap = old_cap ? old_cap * 2 : 64;
    slots = calloc(slot_cap, sizeof *slots);
    if (!slots) abort();
    /* Rehashing moves slots, so the dirty list is rebuilt in its old order. */
    size_t *moved = NULL;
    if (dirty_len) {
        moved = xmalloc(old_cap * sizeof *moved);
    }
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

/* Inserts a new entry for `key` (taking ownership of it); the key must not
 * be cached yet. */
static slot_t *cache_insert(uint8_t *key, size_t len, uint64_t hash) {
    if ((slot_count + 1) * 4 > slot_cap * 3) cache_grow();
    size_t i = hash & (slot_cap - 1);
    while (slots[i].key) i = (i + 1) & (slot_cap - 1);
    slot_t *s = &slots[i];
    memset(s, 0, sizeof *s);
    s->key = key;
    s->key_len = len;
    s->hash = hash;
    slot_count++;
    return s;
}

static void mark_dirty(slot_t *s) {
    if (s->dirty) return;
    s->dirty = true;
    if (dirty_len == dirty_cap) {
        dirty_cap = dirty_cap ? dirty_cap * 2 : 16;
        dirty = realloc(dirty, dirty_cap * sizeof *dirty);
        if (!dirty) abort();
    }
    dirty[dirty_len++] = (size_t)(s - slots);
}

/* Forgets every entry (and any unflushed write). */
static void cache_discard(void) {
    for (size_t i = 0; i < slot_cap; i++) {
        if (!slots[i].key) continue;
        free(slots[i].key);
        free(slots[i].value);
        slots[i].key = NULL;
    }
    slot_count = 0;
    dirty_len = 0;
}

/* Ends a batch: sends the dirty entries with one `state.write` (none if
 * nothing changed), then empties the cache. */
static void cache_finish(void) {
    if (dirty_len) {
        transform_list_tuple2_list_u8_option_list_u8_t entries;
        entries.len = dirty_len;
        entries.ptr = xmalloc(dirty_len * sizeof *entries.ptr);
        for (size_t d = 0; d < dirty_len; d++) {
            const slot_t *s = &slots[dirty[d]];
            transform_tuple2_list_u8_option_list_u8_t *e = &entries.ptr[d];
            e->f0.ptr = s->key;
            e->f0.len = s->key_len;
            e->f1.is_some = s->present;
            e->f1.val.ptr = s->value;
            e->f1.val.len = s->value_len;
        }
        sluice_transform_state_write(&entries);
        free(entries.ptr);
    }
    cache_discard();
}

/* `name 0x00 key`, malloc'd. */
static int value_key(const sluice_value_state_t *st, sluice_bytes_t key, uint8_t **out, size_t *len) {
    if (!st->name || !st->name[0]) return sluice_error("state name must not be empty");
    size_t n = strlen(st->name);
    uint8_t *k = xmalloc(n + 1 + key.len);
    memcpy(k, st->name, n);
    k[n] = 0;
    if (key.len) memcpy(k + n + 1, key.ptr, key.len);
    *out = k;
    *len = n + 1 + key.len;
    return SLUICE_OK;
}

/* The cached entry for the state key `k` (taking ownership of `k`),
 * fetched with one `state.get` on a miss. */
static slot_t *cache_read(uint8_t *k, size_t len) {
    uint64_t h = fnv1a(k, len);
    slot_t *s = cache_find(k, len, h);
    if (s) {
        free(k);
        return s;
    }
    transform_list_u8_t key = {k, len}, value = {NULL, 0};
    bool present = sluice_transform_state_get(&key, &value);
    s = cache_insert(k, len, h);
    s->present = present;
    if (present) {
        s->value = value.len ? value.ptr : NULL;
        s->value_len = value.len;
    }
    return s;
}

/* Stores (`value` non-NULL, copied) or deletes `k` (taking ownership). */
static void cache_write(uint8_t *k, size_t len, const uint8_t *value, size_t value_len) {
    uint64_t h = fnv1a(k, len);
    slot_t *s = cache_find(k, len, h);
    if (s) {
        free(k);
        bool same = s->present == (value != NULL) &&
                    (!value || (s->value_len == value_len && (value_len == 0 || memcmp(s->value, value, value_len) == 0)));
        if (same) return; /* the cache (and, if clean, the host) already has exactly this */
        free(s->value);
    } else {
        s = cache_insert(k, len, h);
    }
    s->present = value != NULL;
    s->value = value ? copy_bytes(value, value_len) : NULL;
    s->value_len = value ? value_len : 0;
    mark_dirty(s);
}

int sluice_value_prefetch_keys(const sluice_value_state_t *st, const sluice_bytes_t *keys, size_t n) {
    transform_list_list_u8_t missing = {xmalloc(n * sizeof(transform_list_u8_t)), 0};
    for (size_t i = 0; i < n; i++) {
        uint8_t *k;
        size_t len;
        if (value_key(st, keys[i], &k, &len)) {
            free(missing.ptr);
            return SLUICE_ERR;
        }
        uint64_t h = fnv1a(k, len);
        if (cache_find(k, len, h)) {
            free(k);
            continue;
        }
        /* A placeholder (absent, clean) also dedups the list. */
        missing.ptr[missing.len].ptr = k;
        missing.ptr[missing.len].len = len;
        missing.len++;
        cache_insert(k, len, h);
    }
    int rc = SLUICE_OK;
    if (missing.len) {
        transform_list_option_list_u8_t values = {NULL, 0};
        sluice_transform_state_get_many(&missing, &values);
        if (values.len != missing.len) {
            rc = sluice_error("host bug: state.get-many returned %zu values for %zu keys", values.len, missing.len);
        } else {
            for (size_t i = 0; i < values.len; i++) {
                const transform_list_u8_t *k = &missing.ptr[i];
                slot_t *s = cache_find(k->ptr, k->len, fnv1a(k->ptr, k->len));
                s->present = values.ptr[i].is_some;
                if (s->present && values.ptr[i].val.len) {
                    s->value = values.ptr[i].val.ptr; /* moves into the cache */
                    s->value_len = values.ptr[i].val.len;
                    values.ptr[i].val.len = 0;
                }
            }
        }
        transform_list_option_list_u8_free(&values);
    }
    free(missing.ptr); /* the keys themselves now belong to the cache */
    return rc;
}

int sluice_value_prefetch(const sluice_value_state_t *st, const sluice_batch_t *batch) {
    sluice_bytes_t *keys = xmalloc(batch->len * sizeof *keys);
    for (size_t i = 0; i < batch->len; i++) keys[i] = sluice_record_key_or_empty(&batch->records[i]);
    int rc = sluice_value_prefetch_keys(st, keys, batch->len);
    free(keys);
    return rc;
}

int sluice_value_get_json(const sluice_value_state_t *st, sluice_bytes_t key, sluice_bytes_t *json, bool *found) {
    uint8_t *k;
    size_t len;
    if (value_key(st, key, &k, &len)) return SLUICE_ERR;
    slot_t *s = cache_read(k, len);
    *found = s->present;
    json->ptr = s->value ? s->value : (const uint8_t *)"";
    json->len = s->value_len;
    return SLUICE_OK;
}

int sluice_value_set_json(const sluice_value_state_t *st, sluice_bytes_t key, sluice_bytes_t json) {
    uint8_t *k;
    size_t len;
    if (value_key(st, key, &k, &len)) return SLUICE_ERR;
    cache_write(k, len, json.ptr ? json.ptr : (const uint8_t *)"", json.len);
    return SLUICE_OK;
}

int sluice_value_clear(const sluice_value_state_t *st, sluice_bytes_t key) {
    uint8_t *k;
    size_t len;
    if (value_key(st, key, &k, &len)) return SLUICE_ERR;
    cache_write(k, len, NULL, 0);
    return SLUICE_OK;
}

static bool json_space(uint8_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

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

static int not_a(const sluice_value_state_t *st, const char *type, sluice_bytes_t json) {
    int n = json.len > 40 ? 40 : (int)json.len;
    return sluice_error("state `%s`: stored value is not a %s: %.*s%s", st->name, type, n, (const char *)json.ptr,
                        json.len > 40 ? "..." : "");
}

int sluice_value_get_u64(const sluice_value_state_t *st, sluice_bytes_t key, uint64_t *value, bool *found) {
    sluice_bytes_t json;
    if (sluice_value_get_json(st, key, &json, found)) return SLUICE_ERR;
    if (!*found) return SLUICE_OK;
    bool neg;
    if (!parse_json_int(json, &neg, value) || (neg && *value)) return not_a(st, "u64", json);
    return SLUICE_OK;
}

int sluice_value_set_u64(const sluice_value_state_t *st, sluice_bytes_t key, uint64_t value) {
    char buf[21];
    return sluice_value_set_json(st, key, sluice_u64_text(value, buf));
}

int sluice_value_get_i64(const sluice_value_state_t *st, sluice_bytes_t key, int64_t *value, bool *found) {
    sluice_bytes_t json;
    if (sluice_value_get_json(st, key, &json, found)) return SLUICE_ERR;
    if (!*found) return SLUICE_OK;
    bool neg;
    uint64_t m;
    if (!parse_json_int(json, &neg, &m) || m > (neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX))
        return not_a(st, "i64", json);
    *value = neg ? (int64_t)(0 - m) : (int64_t)m;
    return SLUICE_OK;
}

int sluice_value_set_i64(const sluice_value_state_t *st, sluice_bytes_t key, int64_t value) {
    char buf[21];
    int n = snprintf(buf, sizeof buf, "%" PRId64, value);
    sluice_bytes_t json = {(const uint8_t *)buf, (size_t)n};
    return sluice_value_set_json(st, key, json);
}

int sluice_value_add_u64(const sluice_value_state_t *st, sluice_bytes_t key, uint64_t delta, uint64_t *result) {
    uint64_t n = 0;
    bool found;
    if (sluice_value_get_u64(st, key, &n, &found)) return SLUICE_ERR;
    if (n > UINT64_MAX - delta) return sluice_error("state `%s`: u64 overflow", st->name);
    n += delta;
    if (result) *result = n;
    return sluice_value_set_u64(st, key, n);
}

/* ---- logging ----------------------------------------------------------- */

void sluice_log(sluice_level_t level, const char *fmt, ...) {
    char small[256];
    va_list args;
    va_start(args, fmt);
    int n = vsnprintf(small, sizeof small, fmt, args);
    va_end(args);
    if (n < 0) return;
    char *buf = small;
    if ((size_t)n >= sizeof small) {
        buf = xmalloc((size_t)n + 1);
        va_start(args, fmt);
        vsnprintf(buf, (size_t)n + 1, fmt, args);
        va_end(args);
    }
    transform_string_t msg = {(uint8_t *)buf, (size_t)n};
    sluice_transform_log_log((sluice_transform_log_level_t)level, &msg);
    if (buf != small) free(buf);
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

static bool initialized;

bool exports_transform_init(transform_list_tuple2_string_string_t *config, transform_string_t *err) {
    sluice_config_t cfg = {config};
    cache_discard();
    int rc = sluice_transform_init(&cfg);
    transform_list_tuple2_string_string_free(config);
    if (rc != SLUICE_OK) {
        cache_discard();
        take_error(err, "");
        return false;
    }
    cache_finish(); /* state touched in init is written back now, and the host refuses it: state belongs to an input partition */
    initialized = true;
    return true;
}

static void free_outputs(sluice_emitter_t *out) {
    for (size_t i = 0; i < out->len; i++) transform_output_record_free(&out->ptr[i]);
    free(out->ptr);
}

bool exports_transform_process(transform_list_input_record_t *batch, transform_list_output_record_t *ret,
                               transform_string_t *err) {
    if (!initialized) {
        transform_list_input_record_free(batch);
        sluice_error("process called before init");
        take_error(err, "");
        return false;
    }
    sluice_emitter_t out = {NULL, 0, 0};
    sluice_batch_t b = {batch->ptr, batch->len};
    char prefix[160];
    int rc;
    cache_discard();
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
        cache_discard();
        free_outputs(&out);
        transform_list_input_record_free(batch);
        take_error(err, prefix);
        return false;
    }
    cache_finish();
    transform_list_input_record_free(batch);
    ret->ptr = out.len ? out.ptr : NULL;
    ret->len = out.len;
    if (!out.len) free(out.ptr);
    return true;
}
