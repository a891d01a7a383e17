/* See fake_host.h. Sorted arrays: small, obviously correct, slow. */
#include "fake_host.h"

#include <stdio.h>
#include <stdlib.h>

host_calls_t host_calls;

typedef struct entry {
    uint8_t *key, *value;
    size_t key_len, value_len;
} entry_t;

static entry_t *store; /* the store of the shard being served */
static size_t store_len, store_cap;

/* The host scopes a call's state to the shard it serves: each shard has a
 * store of its own, swapped in by host_use_shard. */
#define SHARDS 4
typedef struct shard_store {
    entry_t *store;
    size_t len, cap;
} shard_store_t;
static shard_store_t shard_stores[SHARDS];
static uint32_t current_shard;

void host_use_shard(uint32_t shard) {
    if (shard >= SHARDS) abort();
    shard_stores[current_shard] = (shard_store_t){store, store_len, store_cap};
    store = shard_stores[shard].store;
    store_len = shard_stores[shard].len;
    store_cap = shard_stores[shard].cap;
    current_shard = shard;
}

typedef struct ftimer {
    uint8_t clock;
    int64_t at;
    uint8_t *key;
    size_t key_len;
} ftimer_t;

static ftimer_t *timers;
static size_t timers_len, timers_cap;

static bool get_many_broken; /* host_break_get_many */

void host_break_get_many(bool broken) { get_many_broken = broken; }

static bool wm_some;
static int64_t wm_at, now_at;
static char last_log[1024];

static uint8_t *dup(const void *p, size_t n) {
    if (!n) return NULL; /* as the canonical ABI lowers an empty list */
    uint8_t *d = malloc(n);
    if (!d) abort();
    memcpy(d, p, n);
    return d;
}

static int cmp_bytes(const uint8_t *a, size_t al, const uint8_t *b, size_t bl) {
    size_t n = al < bl ? al : bl;
    int c = n ? memcmp(a, b, n) : 0;
    if (c) return c;
    return al < bl ? -1 : al > bl ? 1 : 0;
}

/* The index of `key`, or where it would go (*found false). */
static size_t find(const uint8_t *key, size_t len, bool *found) {
    size_t lo = 0, hi = store_len;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        int c = cmp_bytes(store[mid].key, store[mid].key_len, key, len);
        if (c == 0) {
            *found = true;
            return mid;
        }
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    *found = false;
    return lo;
}

static bool reserved(const uint8_t *key, size_t len) {
    static const uint8_t host_prefix[8] = {0xff, 's', 'l', 'u', 'i', 'c', 'e', 0};
    return len >= 8 && memcmp(key, host_prefix, 8) == 0;
}

void host_state_put(const void *key, size_t len, const void *value, size_t vlen) {
    if (len == 0 || reserved(key, len)) {
        fprintf(stderr, "fake host: the guest wrote a reserved or empty key (the real host traps)\n");
        abort();
    }
    bool found;
    size_t i = find(key, len, &found);
    if (found) {
        free(store[i].value);
    } else {
        if (store_len == store_cap) {
            store_cap = store_cap ? store_cap * 2 : 64;
            store = realloc(store, store_cap * sizeof *store);
        }
        memmove(&store[i + 1], &store[i], (store_len - i) * sizeof *store);
        store_len++;
        store[i].key = dup(key, len);
        store[i].key_len = len;
    }
    store[i].value = dup(value, vlen);
    store[i].value_len = vlen;
}

static void state_remove(const uint8_t *key, size_t len) {
    bool found;
    size_t i = find(key, len, &found);
    if (!found) return;
    free(store[i].key);
    free(store[i].value);
    memmove(&store[i], &store[i + 1], (store_len - i - 1) * sizeof *store);
    store_len--;
}

bool host_state_get(const void *key, size_t len, sluice_bytes_t *value) {
    bool found;
    size_t i = find(key, len, &found);
    if (found && value) *value = sluice_bytes(store[i].value ? store[i].value : (const uint8_t *)"", store[i].value_len);
    return found;
}

size_t host_state_count(const void *prefix, size_t len) {
    size_t n = 0;
    for (size_t i = 0; i < store_len; i++)
        if (store[i].key_len >= len && memcmp(store[i].key, prefix, len) == 0) n++;
    return n;
}

size_t host_state_total(void) { return store_len; }

bool host_state_entry(size_t i, sluice_bytes_t *key, sluice_bytes_t *value) {
    if (i >= store_len) return false;
    *key = sluice_bytes(store[i].key, store[i].key_len);
    *value = sluice_bytes(store[i].value ? store[i].value : (const uint8_t *)"", store[i].value_len);
    return true;
}

void host_reset(void) {
    shard_stores[current_shard] = (shard_store_t){store, store_len, store_cap};
    for (uint32_t shard = 0; shard < SHARDS; shard++) {
        shard_store_t *st = &shard_stores[shard];
        for (size_t i = 0; i < st->len; i++) {
            free(st->store[i].key);
            free(st->store[i].value);
        }
        free(st->store);
        *st = (shard_store_t){NULL, 0, 0};
    }
    store = NULL;
    store_len = store_cap = 0;
    current_shard = 0;
    for (size_t i = 0; i < timers_len; i++) free(timers[i].key);
    free(timers);
    timers = NULL;
    timers_len = timers_cap = 0;
    wm_some = false;
    wm_at = now_at = 0;
    memset(&host_calls, 0, sizeof host_calls);
    last_log[0] = 0;
    get_many_broken = false;
}

void host_set_watermark(bool some, int64_t at) {
    wm_some = some;
    wm_at = at;
}

void host_set_now(int64_t at) { now_at = at; }

const char *host_last_log(void) { return last_log; }

/* ---- the imports (the high-level functions packed_out.h declares) ----------- */

void *cabi_realloc(void *ptr, size_t old_size, size_t align, size_t new_size) {
    (void)old_size;
    if (new_size == 0) return (void *)align;
    void *ret = realloc(ptr, new_size);
    if (!ret) abort();
    return ret;
}

bool sluice_transform_state_get(packed_out_list_u8_t *key, packed_out_list_u8_t *ret) {
    host_calls.get++;
    sluice_bytes_t v;
    if (!host_state_get(key->ptr, key->len, &v)) {
        /* The generated bindings copy an uninitialised value out for
         * `none`: hand back something no one may free or keep. */
        static uint8_t not_a_value[1];
        ret->ptr = not_a_value;
        ret->len = 1;
        return false;
    }
    ret->ptr = dup(v.ptr, v.len);
    ret->len = v.len;
    return true;
}

/* The packed layouts of wit/sluice.wit, as the host reads and writes them. */
static uint32_t rd_u32(const uint8_t **p) {
    uint32_t v = (uint32_t)(*p)[0] | (uint32_t)(*p)[1] << 8 | (uint32_t)(*p)[2] << 16 | (uint32_t)(*p)[3] << 24;
    *p += 4;
    return v;
}

static void wr(uint8_t **out, size_t *len, size_t *cap, const void *data, size_t n) {
    if (*len + n > *cap) {
        while (*len + n > *cap) *cap = *cap ? *cap * 2 : 64;
        *out = realloc(*out, *cap);
        if (!*out) abort();
    }
    memcpy(*out + *len, data, n);
    *len += n;
}

static void wr_u32(uint8_t **out, size_t *len, size_t *cap, uint32_t v) {
    uint8_t le[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    wr(out, len, cap, le, 4);
}

void sluice_transform_state_get_many_packed(packed_out_list_u8_t *keys, packed_out_list_u8_t *ret) {
    host_calls.get_many++;
    const uint8_t *p = keys->ptr, *end = keys->ptr + keys->len;
    uint8_t *out = NULL;
    size_t len = 0, cap = 0;
    uint32_t n = rd_u32(&p);
    wr_u32(&out, &len, &cap, get_many_broken ? n + 1 : n);
    for (uint32_t i = 0; i < n; i++) {
        uint32_t klen = rd_u32(&p);
        sluice_bytes_t v;
        if (host_state_get(p, klen, &v)) {
            uint8_t one = 1;
            wr(&out, &len, &cap, &one, 1);
            wr_u32(&out, &len, &cap, (uint32_t)v.len);
            wr(&out, &len, &cap, v.ptr, v.len);
        } else {
            uint8_t zero = 0;
            wr(&out, &len, &cap, &zero, 1);
        }
        p += klen;
    }
    if (p != end) abort(); /* the SDK packed more than it counted */
    ret->ptr = out;
    ret->len = len;
}

void sluice_transform_state_set(packed_out_list_u8_t *key, packed_out_list_u8_t *value) {
    host_state_put(key->ptr, key->len, value->ptr, value->len);
}

void sluice_transform_state_delete(packed_out_list_u8_t *key) { state_remove(key->ptr, key->len); }

void sluice_transform_state_write_packed(packed_out_list_u8_t *entries) {
    host_calls.write++;
    const uint8_t *p = entries->ptr, *end = entries->ptr + entries->len;
    uint32_t n = rd_u32(&p);
    for (uint32_t i = 0; i < n; i++) {
        uint32_t klen = rd_u32(&p);
        const uint8_t *key = p;
        p += klen;
        if (*p++) {
            uint32_t vlen = rd_u32(&p);
            host_state_put(key, klen, p, vlen);
            p += vlen;
        } else {
            state_remove(key, klen);
        }
    }
    if (p != end) abort(); /* the SDK packed more than it counted */
}

void sluice_transform_state_scan_prefix(packed_out_list_u8_t *prefix, packed_out_list_u8_t *start_after, uint32_t limit,
                                        packed_out_list_tuple2_list_u8_list_u8_t *ret) {
    host_calls.scan_prefix++;
    size_t cap = 16, n = 0;
    packed_out_tuple2_list_u8_list_u8_t *out = malloc(cap * sizeof *out);
    for (size_t i = 0; i < store_len && n < limit; i++) {
        entry_t *e = &store[i];
        if (e->key_len < prefix->len || memcmp(e->key, prefix->ptr, prefix->len) != 0) continue;
        if (start_after && cmp_bytes(e->key, e->key_len, start_after->ptr, start_after->len) <= 0) continue;
        if (n == cap) out = realloc(out, (cap *= 2) * sizeof *out);
        out[n].f0.ptr = dup(e->key, e->key_len);
        out[n].f0.len = e->key_len;
        out[n].f1.ptr = dup(e->value, e->value_len);
        out[n].f1.len = e->value_len;
        n++;
    }
    if (!n) {
        free(out);
        out = NULL;
    }
    ret->ptr = out;
    ret->len = n;
}

void sluice_transform_log_log(sluice_transform_log_level_t level, packed_out_string_t *message) {
    (void)level;
    host_calls.log++;
    snprintf(last_log, sizeof last_log, "%.*s", (int)message->len, (const char *)message->ptr);
}

bool sluice_transform_time_watermark(int64_t *ret) {
    host_calls.watermark++;
    if (wm_some) *ret = wm_at;
    return wm_some;
}

int64_t sluice_transform_time_processing_time(void) {
    host_calls.processing_time++;
    return now_at;
}

static int cmp_timer(uint8_t clock, int64_t at, const uint8_t *key, size_t len, const ftimer_t *t) {
    if (clock != t->clock) return clock < t->clock ? -1 : 1;
    if (at != t->at) return at < t->at ? -1 : 1;
    return cmp_bytes(key, len, t->key, t->key_len);
}

static size_t timer_find(uint8_t clock, int64_t at, const uint8_t *key, size_t len, bool *found) {
    size_t i = 0;
    *found = false;
    for (; i < timers_len; i++) {
        int c = cmp_timer(clock, at, key, len, &timers[i]);
        if (c == 0) *found = true;
        if (c <= 0) break;
    }
    return i;
}

void sluice_transform_time_set_timer(sluice_transform_time_timer_t *t) {
    host_calls.set_timer++;
    bool found;
    size_t i = timer_find(t->clock, t->at, t->key.ptr, t->key.len, &found);
    if (found) return;
    if (timers_len == timers_cap) {
        timers_cap = timers_cap ? timers_cap * 2 : 16;
        timers = realloc(timers, timers_cap * sizeof *timers);
    }
    memmove(&timers[i + 1], &timers[i], (timers_len - i) * sizeof *timers);
    timers_len++;
    timers[i] = (ftimer_t){t->clock, t->at, dup(t->key.ptr, t->key.len), t->key.len};
}

void sluice_transform_time_delete_timer(sluice_transform_time_timer_t *t) {
    host_calls.delete_timer++;
    bool found;
    size_t i = timer_find(t->clock, t->at, t->key.ptr, t->key.len, &found);
    if (!found) return;
    free(timers[i].key);
    memmove(&timers[i], &timers[i + 1], (timers_len - i - 1) * sizeof *timers);
    timers_len--;
}

bool host_has_timer(sluice_clock_t clock, const void *key, size_t len, int64_t at) {
    bool found;
    timer_find((uint8_t)clock, at, key, len, &found);
    return found;
}

size_t host_timers_pending(void) { return timers_len; }

static bool timer_due(const ftimer_t *t) {
    return t->clock == SLUICE_CLOCK_EVENT ? (wm_some && t->at <= wm_at) : t->at <= now_at;
}

size_t host_timers_due(void) {
    size_t n = 0;
    for (size_t i = 0; i < timers_len; i++) n += timer_due(&timers[i]);
    return n;
}

packed_out_list_timer_t host_take_due(void) {
    packed_out_list_timer_t out = {NULL, 0};
    out.ptr = malloc((timers_len ? timers_len : 1) * sizeof *out.ptr);
    size_t keep = 0;
    /* Sorted by clock, then time: event-time timers by time, then processing ones. */
    for (size_t i = 0; i < timers_len; i++) {
        ftimer_t *t = &timers[i];
        if (timer_due(t)) {
            out.ptr[out.len++] = (packed_out_timer_t){t->clock, {t->key, t->key_len}, t->at};
        } else {
            timers[keep++] = *t;
        }
    }
    timers_len = keep;
    if (!out.len) {
        free(out.ptr);
        out.ptr = NULL;
    }
    return out;
}
