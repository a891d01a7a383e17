/*
 * Native unit tests of the C SDK against the simulated host (fake_host.c):
 * timers, windows (tumbling, hopping, sessions, lateness), time-to-live,
 * map and list state, migrate, config durations and error handling. The
 * expected bytes are the Rust SDK's tests' (guest-sdk/src/{window,state}),
 * so the layouts stay the same across languages. Run by sdks/c/test.sh.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "fake_host.h"

void sluice_testing_call_begin(void);
bool sluice_testing_sizes_add_up(void);
size_t sluice_testing_held_bytes(void);
void sluice_testing_call_finish(void);

static int failures, checks;

#define CHECK(cond)                                                                         \
    do {                                                                                    \
        checks++;                                                                           \
        if (!(cond)) {                                                                      \
            failures++;                                                                     \
            fprintf(stderr, "%s:%d: CHECK failed: %s (last error: %s)\n", __FILE__, __LINE__, #cond, \
                    sluice_last_error() ? sluice_last_error() : "none");                    \
        }                                                                                   \
    } while (0)

#define OK(expr) CHECK((expr) == SLUICE_OK)

static bool bytes_is(sluice_bytes_t b, const void *want, size_t len) {
    return b.len == len && (len == 0 || memcmp(b.ptr, want, len) == 0);
}
#define BYTES_IS(b, lit) bytes_is((b), (lit), sizeof(lit) - 1)

static bool stored_is(const void *key, size_t klen, const char *want) {
    sluice_bytes_t v;
    if (!host_state_get(key, klen, &v)) return want == NULL;
    if (!want) return false;
    bool same = bytes_is(v, want, strlen(want));
    if (!same) fprintf(stderr, "  stored: %.*s, want %s\n", (int)v.len, (const char *)v.ptr, want);
    return same;
}
#define STORED(klit, want) stored_is((klit), sizeof(klit) - 1, (want))

/* ---- the hooks: each test plugs in what it needs ----------------------- */

static int (*on_init)(const sluice_config_t *);
static int (*on_record)(const sluice_record_t *, sluice_emitter_t *);
static int (*on_timer)(const sluice_timer_t *, sluice_emitter_t *);
static int (*on_migrate)(sluice_bytes_t);
static int (*on_begin)(const sluice_batch_t *);

int sluice_transform_init(const sluice_config_t *c) { return on_init ? on_init(c) : SLUICE_OK; }
int sluice_transform_process(const sluice_record_t *r, sluice_emitter_t *out) {
    return on_record ? on_record(r, out) : SLUICE_OK;
}
int sluice_transform_on_timer(const sluice_timer_t *t, sluice_emitter_t *out) {
    return on_timer ? on_timer(t, out) : SLUICE_OK;
}
int sluice_transform_migrate(sluice_bytes_t from) { return on_migrate ? on_migrate(from) : SLUICE_OK; }
int sluice_transform_begin_batch(const sluice_batch_t *b) { return on_begin ? on_begin(b) : SLUICE_OK; }

/* ---- driving the exports as the host does ------------------------------ */

static int64_t next_offset;

static void reset(void) {
    host_reset();
    next_offset = 0;
    on_init = NULL;
    on_record = NULL;
    on_timer = NULL;
    on_migrate = NULL;
    on_begin = NULL;
}

static packed_out_list_u8_t list(const void *p, size_t n) {
    packed_out_list_u8_t l = {NULL, n};
    if (n) {
        l.ptr = malloc(n);
        memcpy(l.ptr, p, n);
    }
    return l;
}

static bool init_with(const char *const *pairs, size_t n) {
    packed_out_list_tuple2_string_string_t cfg = {n ? malloc(n * sizeof *cfg.ptr) : NULL, n};
    for (size_t i = 0; i < n; i++) {
        packed_out_list_u8_t k = list(pairs[2 * i], strlen(pairs[2 * i])), v = list(pairs[2 * i + 1], strlen(pairs[2 * i + 1]));
        cfg.ptr[i].f0 = (packed_out_string_t){k.ptr, k.len};
        cfg.ptr[i].f1 = (packed_out_string_t){v.ptr, v.len};
    }
    packed_out_string_t err = {0};
    bool ok = exports_packed_out_init(&cfg, &err);
    if (!ok) {
        fprintf(stderr, "  init: %.*s\n", (int)err.len, (const char *)err.ptr);
        packed_out_string_free(&err);
    }
    return ok;
}

typedef struct rec {
    const char *key; /* NULL: none */
    const char *value;
    bool has_ts;
    int64_t ts;
} rec_t;

/* The outputs of one call, "key=value" per line, or "ERR message". */
static char result[8192];

static void collect(bool ok, packed_out_list_output_record_t *outs, packed_out_string_t *err) {
    size_t n = 0;
    result[0] = 0;
    if (!ok) {
        snprintf(result, sizeof result, "ERR %.*s", (int)err->len, (const char *)err->ptr);
        packed_out_string_free(err);
        return;
    }
    for (size_t i = 0; i < outs->len && n < sizeof result; i++) {
        packed_out_output_record_t *o = &outs->ptr[i];
        /* "key=value"; a record without a key or value, with a topic or with
         * headers says so. */
        n += snprintf(result + n, sizeof result - n, "%s%.*s=%s%.*s", o->key.is_some ? "" : "(none)",
                      (int)o->key.val.len, (const char *)o->key.val.ptr, o->value.is_some ? "" : "(tombstone)",
                      (int)o->value.val.len, (const char *)o->value.val.ptr);
        if (n < sizeof result && o->topic.is_some)
            n += snprintf(result + n, sizeof result - n, " @%.*s", (int)o->topic.val.len, (const char *)o->topic.val.ptr);
        for (size_t h = 0; h < o->headers.len && n < sizeof result; h++)
            n += snprintf(result + n, sizeof result - n, " %.*s:%.*s", (int)o->headers.ptr[h].key.len,
                          (const char *)o->headers.ptr[h].key.ptr, (int)o->headers.ptr[h].value.len,
                          (const char *)o->headers.ptr[h].value.ptr);
        if (n < sizeof result) n += snprintf(result + n, sizeof result - n, "\n");
    }
    packed_out_list_output_record_free(outs); /* what the generated post-return does */
}

/* How the tests hand batches over and take their outputs back: as a host
 * of 0.1.5 or later does (`process-packed-out`, the SDK exports it), as one
 * of 0.1.3-0.1.4 does (`process-packed`), or as an older one (`process`). */
typedef enum { VIA_PACKED_OUT, VIA_PACKED, VIA_LIST } via_t;
static via_t via;

static void put(sluice_buf_t *b, const void *p, size_t n) { sluice_buf_append(b, p, n); }
static void put_u32(sluice_buf_t *b, uint32_t v) {
    uint8_t le[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    put(b, le, 4);
}
static void put_s64(sluice_buf_t *b, int64_t v) {
    for (int i = 0; i < 8; i++) {
        uint8_t byte = (uint8_t)((uint64_t)v >> (8 * i));
        put(b, &byte, 1);
    }
}
static void put_bytes(sluice_buf_t *b, const char *s) {
    put_u32(b, (uint32_t)strlen(s));
    put(b, s, strlen(s));
}

typedef struct full_rec {
    rec_t rec;
    const char *topic;
    const char *header_key; /* NULL: no header */
    const char *header_value;
} full_rec_t;

/* `recs` as the host packs them (wit/sluice.wit, `packed-batch`). */
static packed_out_packed_batch_t pack(const full_rec_t *recs, size_t n, int32_t partition) {
    sluice_buf_t b = {0};
    const char *topics[8];
    uint32_t ntopics = 0;
    put_u32(&b, (uint32_t)partition);
    for (size_t i = 0; i < n; i++) {
        uint32_t t = 0;
        while (t < ntopics && strcmp(topics[t], recs[i].topic) != 0) t++;
        if (t == ntopics) topics[ntopics++] = recs[i].topic;
    }
    put_u32(&b, ntopics);
    for (uint32_t t = 0; t < ntopics; t++) put_bytes(&b, topics[t]);
    put_u32(&b, (uint32_t)n);
    for (size_t i = 0; i < n; i++) {
        const rec_t *r = &recs[i].rec;
        uint8_t flags = (uint8_t)((r->key ? 1 : 0) | (r->value ? 2 : 0) | (r->has_ts ? 4 : 0));
        put(&b, &flags, 1);
        uint32_t t = 0;
        while (strcmp(topics[t], recs[i].topic) != 0) t++;
        put_u32(&b, t);
        put_s64(&b, next_offset++);
        if (r->has_ts) put_s64(&b, r->ts);
        if (r->key) put_bytes(&b, r->key);
        if (r->value) put_bytes(&b, r->value);
        put_u32(&b, recs[i].header_key ? 1 : 0);
        if (recs[i].header_key) {
            put_bytes(&b, recs[i].header_key);
            put_bytes(&b, recs[i].header_value);
        }
    }
    return (packed_out_packed_batch_t){b.ptr, b.len};
}

/* The test's own reader of `packed-outputs` (wit/sluice.wit), written from
 * the WIT's layout rather than shared with the SDK, so that neither side's
 * reading of it checks itself: the records as `process-packed` would have
 * returned them. A string that does not follow the layout fails the test. */
static uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static packed_out_list_u8_t read_part(const uint8_t **at, const uint8_t *end) {
    if (end - *at < 4 || (size_t)(end - *at - 4) < le32(*at)) {
        fprintf(stderr, "packed-outputs: a length runs past the end\n");
        abort();
    }
    uint32_t n = le32(*at);
    packed_out_list_u8_t part = list(*at + 4, n);
    *at += 4 + n;
    return part;
}

static packed_out_list_output_record_t read_packed_outputs(const packed_out_packed_outputs_t *packed) {
    const uint8_t *at = packed->ptr, *end = packed->ptr + packed->len;
    if (packed->len < 4) abort();
    uint32_t count = le32(at);
    at += 4;
    packed_out_list_output_record_t outs = {count ? calloc(count, sizeof *outs.ptr) : NULL, count};
    for (uint32_t i = 0; i < count; i++) {
        packed_out_output_record_t *o = &outs.ptr[i];
        if (at == end) abort();
        uint8_t flags = *at++;
        if (flags & ~7) abort();
        if (flags & 4) {
            packed_out_list_u8_t t = read_part(&at, end);
            o->topic.is_some = true;
            o->topic.val = (packed_out_string_t){t.ptr, t.len};
        }
        if (flags & 1) o->key.is_some = true, o->key.val = read_part(&at, end);
        if (flags & 2) o->value.is_some = true, o->value.val = read_part(&at, end);
        if (end - at < 4) abort();
        uint32_t headers = le32(at);
        at += 4;
        o->headers.ptr = headers ? calloc(headers, sizeof *o->headers.ptr) : NULL;
        o->headers.len = headers;
        for (uint32_t h = 0; h < headers; h++) {
            packed_out_list_u8_t k = read_part(&at, end);
            o->headers.ptr[h].key = (packed_out_string_t){k.ptr, k.len};
            o->headers.ptr[h].value = read_part(&at, end);
        }
    }
    if (at != end) {
        fprintf(stderr, "packed-outputs: %td bytes after the last record\n", end - at);
        abort();
    }
    return outs;
}

static const char *process_packed(const full_rec_t *recs, size_t n, int32_t partition) {
    packed_out_packed_batch_t batch = pack(recs, n, partition);
    packed_out_list_output_record_t outs = {0};
    packed_out_string_t err = {0};
    bool ok;
    if (via == VIA_PACKED_OUT) {
        packed_out_packed_outputs_t packed = {0};
        ok = exports_packed_out_process_packed_out(&batch, &packed, &err);
        if (ok) {
            outs = read_packed_outputs(&packed);
            packed_out_packed_outputs_free(&packed); /* what the generated post-return does */
        }
    } else {
        ok = exports_packed_out_process_packed(&batch, &outs, &err);
    }
    collect(ok, &outs, &err);
    return result;
}

static const char *process_full(const full_rec_t *recs, size_t n, int32_t partition) {
    if (via != VIA_LIST) return process_packed(recs, n, partition);
    packed_out_list_input_record_t batch = {malloc((n ? n : 1) * sizeof *batch.ptr), n};
    for (size_t i = 0; i < n; i++) {
        const rec_t *rec = &recs[i].rec;
        packed_out_input_record_t *r = &batch.ptr[i];
        memset(r, 0, sizeof *r);
        if (rec->key) {
            r->key.is_some = true;
            r->key.val = list(rec->key, strlen(rec->key));
        }
        if (rec->value) {
            r->value.is_some = true;
            r->value.val = list(rec->value, strlen(rec->value));
        }
        r->timestamp.is_some = rec->has_ts;
        r->timestamp.val = rec->ts;
        packed_out_list_u8_t topic = list(recs[i].topic, strlen(recs[i].topic));
        r->topic = (packed_out_string_t){topic.ptr, topic.len};
        r->partition = partition;
        r->offset = next_offset++;
        if (recs[i].header_key) {
            r->headers.ptr = malloc(sizeof *r->headers.ptr);
            r->headers.len = 1;
            packed_out_list_u8_t k = list(recs[i].header_key, strlen(recs[i].header_key));
            r->headers.ptr[0].key = (packed_out_string_t){k.ptr, k.len};
            r->headers.ptr[0].value = list(recs[i].header_value, strlen(recs[i].header_value));
        }
    }
    packed_out_list_output_record_t outs = {0};
    packed_out_string_t err = {0};
    bool ok = exports_packed_out_process(&batch, &outs, &err);
    collect(ok, &outs, &err);
    return result;
}

static const char *process(const rec_t *recs, size_t n) {
    full_rec_t full[64];
    if (n > sizeof full / sizeof *full) return "ERR process: too many records for the test's buffer";
    for (size_t i = 0; i < n; i++) full[i] = (full_rec_t){recs[i], "in", NULL, NULL};
    return process_full(full, n, 0);
}

/* Fires what is due with one `on-timers` call, as the host does after a call. */
static const char *fire_due(void) {
    packed_out_list_timer_t due = host_take_due();
    packed_out_list_output_record_t outs = {0};
    packed_out_string_t err = {0};
    bool ok = exports_packed_out_on_timers(&due, &outs, &err);
    collect(ok, &outs, &err);
    return result;
}

/* The outputs of every round of `advance_watermark`. */
static char rounds[16384];

/* Moves the watermark to `at` and fires what is due as the host does: round
 * after round, each its own call into the transform, while firing sets
 * timers that are due. The outputs of all rounds, or the first error. */
static const char *advance_watermark(int64_t at) {
    host_set_watermark(true, at);
    size_t n = 0;
    rounds[0] = 0;
    for (int round = 0; round < 1000; round++) {
        if (host_timers_due() == 0) return rounds;
        const char *got = fire_due();
        if (strncmp(got, "ERR ", 4) == 0) return got;
        n += (size_t)snprintf(rounds + n, sizeof rounds - n, "%s", got);
        if (n >= sizeof rounds) return "ERR advance_watermark: outputs too long for the test's buffer";
    }
    return "ERR advance_watermark: timers still due after 1000 rounds";
}

#define R(k, v, t) {(k), (v), true, (t)}
#define RESULT_IS(got, want)                                                         \
    do {                                                                             \
        const char *g_ = (got);                                                      \
        checks++;                                                                    \
        if (strcmp(g_, (want)) != 0) {                                               \
            failures++;                                                              \
            fprintf(stderr, "%s:%d: got\n%s\nwant\n%s\n", __FILE__, __LINE__, g_, (want)); \
        }                                                                            \
    } while (0)

/* ---- value state, the batch lifecycle, errors -------------------------- */

static const sluice_value_state_t COUNTS = {.name = "count"};

static int count_record(const sluice_record_t *r, sluice_emitter_t *out) {
    uint64_t n;
    if (sluice_value_add_u64(&COUNTS, sluice_record_key_or_empty(r), 1, &n)) return SLUICE_ERR;
    if (sluice_bytes_eq(sluice_record_value_or_empty(r), "fail")) return sluice_error("asked to fail at %" PRIu64, n);
    char text[21];
    return sluice_emit(out, sluice_record_key_or_empty(r), sluice_u64_text(n, text));
}

static void test_running_count_and_failed_batches(void) {
    reset();
    on_record = count_record;
    CHECK(init_with(NULL, 0));
    rec_t b1[] = {R("a", "x", 1), R("b", "x", 2), R("a", "x", 3)};
    RESULT_IS(process(b1, 3), "a=1\nb=1\na=2\n");
    CHECK(STORED("count\0a", "2"));
    CHECK(host_calls.write == 1);
    rec_t b2[] = {R("a", "x", 4), R("a", "fail", 5)};
    RESULT_IS(process(b2, 2), "ERR record in-0@4: asked to fail at 4");
    CHECK(STORED("count\0a", "2")); /* the failed batch wrote nothing */
    CHECK(host_calls.write == 1);
    host_state_put("count\0z", 7, "\"text\"", 6);
    rec_t b3[] = {R("z", "x", 6)};
    RESULT_IS(process(b3, 1), "ERR record in-0@5: state `count`: stored value is not a u64: \"text\"");
    /* At the top of u64 an add fails and writes nothing; adding 0 changes nothing. */
    host_state_put("count\0m", 7, "18446744073709551615", 20);
    sluice_testing_call_begin();
    uint64_t n = 7;
    CHECK(sluice_value_add_u64(&COUNTS, sluice_str("m"), 1, &n) == SLUICE_ERR);
    CHECK(strcmp(sluice_last_error(), "state `count`: u64 overflow") == 0 && n == 7);
    OK(sluice_value_add_u64(&COUNTS, sluice_str("m"), 0, &n));
    CHECK(n == UINT64_MAX);
    OK(sluice_value_add_u64(&COUNTS, sluice_str("new"), 0, &n));
    CHECK(n == 0);
    int writes = host_calls.write;
    sluice_testing_call_finish();
    CHECK(STORED("count\0m", "18446744073709551615"));
    CHECK(STORED("count\0new", "0")); /* a new key is written, even with 0 */
    CHECK(host_calls.write == writes + 1);
}

/* Every field of a record as the SDK shows it. */
static int describe_record(const sluice_record_t *r, sluice_emitter_t *out) {
    sluice_buf_t v = {0};
    int64_t ts = 0;
    sluice_bytes_t header = {0}, topic = sluice_record_topic(r), value = sluice_record_value_or_empty(r);
    bool has_ts = sluice_record_timestamp(r, &ts), has_header = sluice_record_header(r, "h", &header);
    sluice_buf_printf(&v, "%s:%.*s ts=%s%" PRId64 " %.*s-%" PRId32 "@%" PRId64 " h=%s%.*s",
                      sluice_record_has_value(r) ? "value" : "tombstone", (int)value.len, (const char *)value.ptr,
                      has_ts ? "" : "none/", ts, (int)topic.len, (const char *)topic.ptr, sluice_record_partition(r),
                      sluice_record_offset(r), has_header ? "" : "none/", (int)header.len, (const char *)header.ptr);
    int rc = sluice_emit(out, sluice_record_has_key(r) ? sluice_record_key_or_empty(r) : sluice_str("-"),
                         sluice_buf_bytes(&v));
    sluice_buf_free(&v);
    return rc;
}

static void test_packed_and_listed_batches_agree(void) {
    full_rec_t recs[] = {
        {R("a", "one", 5), "in", "h", "x"},
        {{NULL, "keyless", false, 0}, "in", NULL, NULL},
        {{"b", NULL, true, -3}, "other", "h", ""},
        {R("a", "", 7), "other", "g", "not h"},
    };
    char listed[sizeof result];
    reset();
    on_record = describe_record;
    CHECK(init_with(NULL, 0));
    via = VIA_LIST;
    snprintf(listed, sizeof listed, "%s", process_full(recs, 4, 3));
    via = VIA_PACKED;
    next_offset = 0;
    RESULT_IS(process_full(recs, 4, 3), listed);
    via = VIA_PACKED_OUT;
    next_offset = 0;
    RESULT_IS(process_full(recs, 4, 3), listed);
    RESULT_IS(listed, "a=value:one ts=5 in-3@0 h=x\n"
                      "-=value:keyless ts=none/0 in-3@1 h=none/\n"
                      "b=tombstone: ts=-3 other-3@2 h=\n"
                      "a=value: ts=7 other-3@3 h=none/\n");
    /* An empty batch, and one the host got wrong. */
    RESULT_IS(process_full(recs, 0, 0), "");
    packed_out_packed_batch_t cut = pack(recs, 4, 3);
    cut.len -= 1;
    packed_out_list_output_record_t outs = {0};
    packed_out_string_t err = {0};
    collect(exports_packed_out_process_packed(&cut, &outs, &err), &outs, &err);
    CHECK(strncmp(result, "ERR host bug: a malformed packed batch", 38) == 0);
    packed_out_packed_batch_t huge = pack(recs, 1, 0);
    memset(huge.ptr + 4, 0xff, 4); /* a topic count far past the bytes there are */
    collect(exports_packed_out_process_packed(&huge, &outs, &err), &outs, &err);
    CHECK(strncmp(result, "ERR host bug: a malformed packed batch", 38) == 0);
    packed_out_packed_batch_t cut_again = pack(recs, 4, 3);
    cut_again.len -= 1;
    packed_out_packed_outputs_t packed = {0};
    CHECK(!exports_packed_out_process_packed_out(&cut_again, &packed, &err));
    packed_out_string_free(&err);
}

/* Outputs of every shape: without a key, a tombstone, to a named topic,
 * with headers (added after the record, and forwarded from the input),
 * empty key and value. Each export hands back the same records: the packed
 * ones read by the test's own reader. */
static int emit_every_shape(const sluice_record_t *r, sluice_emitter_t *out) {
    sluice_bytes_t k = sluice_str("k"), v = sluice_str("v"), empty = sluice_str("");
    if (sluice_emit_record(out, NULL, &v, NULL) || sluice_emit_record(out, &k, NULL, "side") ||
        sluice_emit_record(out, &empty, &empty, NULL) || sluice_emit(out, k, v) ||
        sluice_emit_header(out, "a", sluice_str("1")) || sluice_emit_header(out, "b", sluice_str("")) ||
        sluice_forward(out, r) || sluice_emit_header(out, "c", sluice_str("3")))
        return SLUICE_ERR;
    return sluice_emitted(out) == 5 ? SLUICE_OK : sluice_error("sluice_emitted: %zu", sluice_emitted(out));
}

static int header_first(const sluice_record_t *r, sluice_emitter_t *out) {
    (void)r;
    return sluice_emit_header(out, "a", sluice_str("1"));
}

static void test_every_output_shape_through_every_export(void) {
    full_rec_t recs[] = {{R("in-key", "in-value", 1), "in", "h", "x"}};
    const char *want = "(none)=v\n"
                       "k=(tombstone) @side\n"
                       "=\n"
                       "k=v a:1 b:\n"
                       "in-key=in-value h:x c:3\n";
    const via_t vias[] = {VIA_PACKED_OUT, VIA_PACKED, VIA_LIST};
    for (size_t i = 0; i < sizeof vias / sizeof *vias; i++) {
        reset();
        on_record = emit_every_shape;
        CHECK(init_with(NULL, 0));
        via = vias[i];
        RESULT_IS(process_full(recs, 1, 0), want);
        /* No outputs at all. */
        on_record = NULL;
        RESULT_IS(process_full(recs, 1, 0), "");
    }
    via = VIA_PACKED_OUT;
    /* A header before any record is the hook's error. */
    reset();
    on_record = header_first;
    CHECK(init_with(NULL, 0));
    RESULT_IS(process_full(recs, 1, 0), "ERR record in-0@0: sluice_emit_header: no record emitted yet");
}

static void test_prefetch_reads_a_batch_with_one_get_many_and_writes_back_once(void) {
    reset();
    host_state_put("count\0a", 7, "4", 1);
    host_state_put("count\0c", 7, "9", 1);
    sluice_testing_call_begin();
    sluice_bytes_t keys[] = {sluice_str("a"), sluice_str("b"), sluice_str("a"), sluice_str("c")};
    OK(sluice_value_prefetch_keys(&COUNTS, keys, 4));
    OK(sluice_value_prefetch_keys(&COUNTS, keys, 2)); /* all cached: no call */
    CHECK(host_calls.get_many == 1);
    uint64_t a = 0, b = 0, c = 0;
    bool found_a = false, found_b = true, found_c = false;
    OK(sluice_value_get_u64(&COUNTS, keys[0], &a, &found_a));
    OK(sluice_value_get_u64(&COUNTS, keys[1], &b, &found_b));
    OK(sluice_value_get_u64(&COUNTS, keys[3], &c, &found_c));
    CHECK(found_a && a == 4 && !found_b && found_c && c == 9);
    CHECK(host_calls.get == 0);
    OK(sluice_value_set_u64(&COUNTS, keys[1], 1));
    OK(sluice_value_clear(&COUNTS, keys[3]));
    sluice_testing_call_finish();
    CHECK(host_calls.write == 1);
    CHECK(STORED("count\0a", "4") && STORED("count\0b", "1") && STORED("count\0c", NULL));

    /* More keys and values than one block of the cache's bytes holds, over
     * two calls: each call sees the host's values, none of the last call's. */
    enum { MANY = 3000 };
    static char names[MANY][48];
    static sluice_bytes_t many[MANY];
    for (int i = 0; i < MANY; i++) {
        snprintf(names[i], sizeof names[i], "a-rather-long-key-of-forty-bytes-%06d", i);
        many[i] = sluice_str(names[i]);
    }
    for (int round = 0; round < 2; round++) {
        host_calls.get_many = host_calls.get = host_calls.write = 0;
        sluice_testing_call_begin();
        OK(sluice_value_prefetch_keys(&COUNTS, many, MANY));
        bool all = true;
        for (int i = 0; i < MANY; i++) {
            uint64_t n = 0;
            all = all && sluice_value_add_u64(&COUNTS, many[i], 1, &n) == SLUICE_OK &&
                  n == (round == 0 ? 1 : (uint64_t)(100000 + i + 1));
        }
        CHECK(all && host_calls.get_many == 1 && host_calls.get == 0);
        sluice_testing_call_finish();
        CHECK(host_calls.write == 1);
        for (int i = 0; i < MANY; i++) {
            char stored[32];
            snprintf(stored, sizeof stored, "%d", 100000 + i);
            uint8_t key[64] = "count";
            size_t klen = 6 + many[i].len;
            memcpy(key + 6, many[i].ptr, many[i].len);
            host_state_put(key, klen, stored, strlen(stored));
        }
    }
}

/* ---- timers ------------------------------------------------------------ */

static int set_timers(const sluice_record_t *r, sluice_emitter_t *out) {
    (void)out;
    int64_t ts, w;
    sluice_record_timestamp(r, &ts);
    /* The watermark is asked once per call, however often. */
    sluice_watermark(&w);
    sluice_watermark(&w);
    if (sluice_bytes_eq(sluice_record_value_or_empty(r), "delete"))
        return sluice_timer_delete(SLUICE_CLOCK_EVENT, sluice_record_key_or_empty(r), ts + 10);
    if (sluice_timer_set(SLUICE_CLOCK_EVENT, sluice_record_key_or_empty(r), ts + 10)) return SLUICE_ERR;
    return sluice_timer_set(SLUICE_CLOCK_PROCESSING, sluice_record_key_or_empty(r), 1000);
}

static int emit_timer(const sluice_timer_t *t, sluice_emitter_t *out) {
    if (t->key.len && t->key.ptr[0] == 'x') return sluice_error("boom");
    sluice_buf_t v = {0};
    sluice_buf_printf(&v, "%s@%" PRId64, t->clock == SLUICE_CLOCK_EVENT ? "event" : "processing", t->at);
    int rc = sluice_emit(out, t->key, sluice_buf_bytes(&v));
    sluice_buf_free(&v);
    return rc;
}

static int late_record(const sluice_record_t *r, sluice_emitter_t *out) {
    return sluice_emit(out, sluice_record_key_or_empty(r), sluice_str(sluice_record_is_late(r) ? "late" : "on time"));
}

/* A prefetch whose answer is malformed fails, and the keys it was to load
 * are not taken for absent afterwards: a read asks the host. */
static void test_keys_of_a_failed_prefetch_are_read_from_the_host(void) {
    reset();
    host_state_put("count\0a", 7, "5", 1);
    host_break_get_many(true);
    sluice_testing_call_begin();
    sluice_bytes_t keys[] = {sluice_str("a"), sluice_str("b")};
    CHECK(sluice_value_prefetch_keys(&COUNTS, keys, 2) == SLUICE_ERR);
    uint64_t a = 0;
    bool found = false;
    OK(sluice_value_get_u64(&COUNTS, keys[0], &a, &found));
    CHECK(found && a == 5);
    CHECK(host_calls.get == 1);
    OK(sluice_value_set_u64(&COUNTS, keys[1], 1)); /* and a write of the other still goes out */
    sluice_testing_call_finish();
    CHECK(STORED("count\0b", "1"));
}

static void test_timers(void) {
    reset();
    on_record = set_timers;
    on_timer = emit_timer;
    CHECK(init_with(NULL, 0));
    rec_t b[] = {R("a", "", 5), R("b", "", 1), R("c", "", 7), R("c", "delete", 7)};
    RESULT_IS(process(b, 4), "");
    CHECK(host_calls.watermark == 1);
    CHECK(host_has_timer(SLUICE_CLOCK_EVENT, "a", 1, 15) && host_has_timer(SLUICE_CLOCK_EVENT, "b", 1, 11));
    CHECK(!host_has_timer(SLUICE_CLOCK_EVENT, "c", 1, 17));
    RESULT_IS(advance_watermark(14), "b=event@11\n");
    host_set_now(1000);
    RESULT_IS(advance_watermark(20), "a=event@15\na=processing@1000\nb=processing@1000\nc=processing@1000\n");
    CHECK(host_timers_pending() == 0);

    /* An error names the timer as the Rust SDK does ({:?} of the key). */
    rec_t x[] = {R("x\001\"\n\xff", "", 0)};
    process(x, 1);
    RESULT_IS(advance_watermark(10), "ERR timer Event \"x\\u{1}\\\"\\n\xef\xbf\xbd\"@10: boom");

    /* is_late: at or below the watermark as of the call's start. */
    reset();
    on_record = late_record;
    CHECK(init_with(NULL, 0));
    rec_t l[] = {R("k", "", 5), R("k", "", 6), {"k", "", false, 0}};
    host_set_watermark(true, 5);
    RESULT_IS(process(l, 3), "k=late\nk=on time\nk=on time\n");
}

static int timer_in_init(const sluice_config_t *c) {
    (void)c;
    return sluice_timer_set(SLUICE_CLOCK_EVENT, sluice_str("k"), 1);
}

static void test_timers_need_a_shard(void) {
    reset();
    on_init = timer_in_init;
    CHECK(!init_with(NULL, 0));
    CHECK(host_timers_pending() == 0);
}

/* ---- windows ----------------------------------------------------------- */

static const sluice_windows_t TUMBLING = {.name = "t", .size_ms = 10, .slide_ms = 10};

/* Fires through `firing`, emitting "start end value" under each closed
 * window's key, in the order fired. */
typedef int (*fire_fn)(const sluice_timer_t *, const sluice_window_t **, size_t *);
static fire_fn firing;

static int fire_hook(const sluice_timer_t *t, sluice_emitter_t *out) {
    const sluice_window_t *closed;
    size_t n;
    if (firing(t, &closed, &n)) return SLUICE_ERR;
    sluice_buf_t v = {0};
    int rc = SLUICE_OK;
    for (size_t i = 0; i < n && rc == SLUICE_OK; i++) {
        const sluice_window_t *w = &closed[i];
        sluice_buf_clear(&v);
        sluice_buf_printf(&v, "%" PRId64 " %" PRId64 " %.*s", w->start, w->end, (int)w->value.len, (const char *)w->value.ptr);
        rc = sluice_emit(out, w->key, sluice_buf_bytes(&v));
    }
    sluice_buf_free(&v);
    return rc;
}

/* The windows `fire_windows` fires. */
static const sluice_windows_t *fired_windows;
static int fire_windows(const sluice_timer_t *t, const sluice_window_t **closed, size_t *n) {
    return sluice_windows_fire(fired_windows, t, closed, n);
}

/* Makes the transform's on-timer hook fire `w`. */
static void fire_through(const sluice_windows_t *w) {
    on_timer = fire_hook;
    firing = fire_windows;
    fired_windows = w;
}

static size_t add_count(const sluice_windows_t *w, const char *key, int64_t ts) {
    size_t added = 99;
    sluice_testing_call_begin();
    OK(sluice_windows_add(w, sluice_str(key), ts, sluice_fold_count, NULL, &added));
    sluice_testing_call_finish();
    return added;
}

static void test_tumbling_windows(void) {
    reset();
    fire_through(&TUMBLING);
    CHECK(init_with(NULL, 0));
    const struct {
        const char *k;
        int64_t ts;
    } adds[] = {{"a", 1}, {"a", 9}, {"b", 5}, {"a", 10}, {"a", -1}};
    for (size_t i = 0; i < 5; i++) CHECK(add_count(&TUMBLING, adds[i].k, adds[i].ts) == 1);
    /* The Rust layout: map entry (t, start as an i64 map key's 8 bytes, a),
     * and one timer `t` per window end at end - 1. */
    CHECK(STORED("t\0\0\0\0\x08\x80\0\0\0\0\0\0\0a", "2"));
    CHECK(STORED("t\0\0\0\0\x08\x80\0\0\0\0\0\0\0b", "1"));
    CHECK(STORED("t\0\0\0\0\x08\x7f\xff\xff\xff\xff\xff\xff\xf6" "a", "1")); /* start -10 */
    CHECK(host_timers_pending() == 3);
    CHECK(host_has_timer(SLUICE_CLOCK_EVENT, "t", 1, 9) && host_has_timer(SLUICE_CLOCK_EVENT, "t", 1, -1) &&
          host_has_timer(SLUICE_CLOCK_EVENT, "t", 1, 19));
    RESULT_IS(advance_watermark(-2), "");
    RESULT_IS(advance_watermark(8), "a=-10 0 1\n");
    RESULT_IS(advance_watermark(9), "a=0 10 2\nb=0 10 1\n");
    CHECK(add_count(&TUMBLING, "a", 3) == 0); /* its window has fired: too late */
    CHECK(host_timers_pending() == 1);
    RESULT_IS(advance_watermark(19), "a=10 20 1\n");
    CHECK(host_timers_pending() == 0);
    CHECK(host_state_count("t\0", 2) == 0); /* every window's state is gone */

    const sluice_window_t *closed = NULL;
    size_t n = 99;
    sluice_timer_t again = {SLUICE_CLOCK_EVENT, sluice_str("t"), 9};
    sluice_timer_t resumed = {SLUICE_CLOCK_EVENT, sluice_bytes("t\001a", 3), 9};
    sluice_timer_t per_key = {SLUICE_CLOCK_EVENT, sluice_bytes("t\0a", 3), 9};
    sluice_timer_t other = {SLUICE_CLOCK_EVENT, sluice_str("other"), 9};
    sluice_timer_t processing = {SLUICE_CLOCK_PROCESSING, sluice_str("t"), 19};
    sluice_testing_call_begin();
    OK(sluice_windows_fire(&TUMBLING, &again, &closed, &n));
    CHECK(n == 0 && closed == NULL); /* a fired window's state is gone */
    n = 99;
    OK(sluice_windows_fire(&TUMBLING, &resumed, &closed, &n));
    CHECK(n == 0 && closed == NULL); /* nor is there any after `a` */
    n = 99;
    OK(sluice_windows_fire(&TUMBLING, &per_key, &closed, &n));
    CHECK(n == 0); /* nor is there one stored per key */
    n = 99;
    OK(sluice_windows_fire(&TUMBLING, &other, &closed, &n));
    CHECK(n == 0); /* another window's timer */
    n = 99;
    OK(sluice_windows_fire(&TUMBLING, &processing, &closed, &n));
    CHECK(n == 0); /* a processing-time timer */
    sluice_windows_t bad = sluice_windows_hopping("bad", 10, 20);
    CHECK(sluice_windows_add(&bad, sluice_str("k"), 1, sluice_fold_count, NULL, NULL) == SLUICE_ERR);
    CHECK(strcmp(sluice_last_error(), "windows `bad`: the size and slide must be positive, and the slide at most the size") == 0);
    sluice_testing_call_finish();

    /* A stored accumulator that is not JSON is an error, not a window. */
    host_state_put("t\0\0\0\0\x08\x80\0\0\0\0\0\0\x14z", 15, "{oops", 5);
    sluice_timer_t bad_json = {SLUICE_CLOCK_EVENT, sluice_str("t"), 29};
    sluice_testing_call_begin();
    CHECK(sluice_windows_fire(&TUMBLING, &bad_json, &closed, &n) == SLUICE_ERR && n == 0);
    CHECK(strcmp(sluice_last_error(), "state `t`: invalid JSON") == 0);
    sluice_testing_call_finish();
}

static void test_window_timers_once_per_call(void) {
    reset();
    fire_through(&TUMBLING);
    CHECK(init_with(NULL, 0));
    sluice_testing_call_begin();
    OK(sluice_windows_add(&TUMBLING, sluice_str("a"), 1, sluice_fold_count, NULL, NULL));
    OK(sluice_windows_add(&TUMBLING, sluice_str("b"), 2, sluice_fold_count, NULL, NULL));
    OK(sluice_windows_add(&TUMBLING, sluice_str("a"), 3, sluice_fold_count, NULL, NULL));
    OK(sluice_windows_add(&TUMBLING, sluice_str("b"), 12, sluice_fold_count, NULL, NULL));
    sluice_testing_call_finish();
    CHECK(host_calls.set_timer == 2); /* one crossing per window end and call */
    CHECK(add_count(&TUMBLING, "c", 4) == 1);
    CHECK(host_calls.set_timer == 3); /* a new call sets it again (a no-op on the host) */
    CHECK(host_timers_pending() == 2);
    CHECK(add_count(&TUMBLING, "c", 5) == 1);
    CHECK(host_calls.set_timer == 3); /* a window with state has its timer */
    RESULT_IS(advance_watermark(19), "a=0 10 2\nb=0 10 1\nc=0 10 2\nb=10 20 1\n");
    CHECK(host_timers_pending() == 0 && host_state_total() == 0);
}

static const sluice_windows_t W = {.name = "w", .size_ms = 10, .slide_ms = 10};

static void test_one_timer_per_window_end_closes_every_keys_window_in_pages(void) {
    reset();
    fire_through(&W);
    CHECK(init_with(NULL, 0));
    enum { KEYS = SLUICE_WINDOWS_PER_FIRING * 2 + 5 };
    static char keys[KEYS][16];
    sluice_testing_call_begin();
    for (int i = 0; i < KEYS; i++) {
        snprintf(keys[i], sizeof keys[i], "key-%04d", i);
        OK(sluice_windows_add(&W, sluice_str(keys[i]), 3, sluice_fold_count, NULL, NULL));
        OK(sluice_windows_add(&W, sluice_str(keys[i]), 12, sluice_fold_count, NULL, NULL));
    }
    sluice_testing_call_finish();
    /* One timer per window end, not per key. */
    CHECK(host_timers_pending() == 2);
    CHECK(host_has_timer(SLUICE_CLOCK_EVENT, "w", 1, 9) && host_has_timer(SLUICE_CLOCK_EVENT, "w", 1, 19));
    CHECK(host_calls.set_timer == 2);
    CHECK(STORED("w\0\0\0\0\x08\x80\0\0\0\0\0\0\0key-0000", "1"));
    CHECK(STORED("w\0\0\0\0\x08\x80\0\0\0\0\0\0\x0akey-0132", "1"));

    /* The first firing closes one page and goes on after its last key. */
    host_calls.scan_prefix = 0;
    host_set_watermark(true, 9);
    packed_out_list_timer_t due = host_take_due();
    CHECK(due.len == 1 && due.ptr[0].clock == SLUICE_CLOCK_EVENT && due.ptr[0].at == 9 && due.ptr[0].key.len == 1 &&
          due.ptr[0].key.ptr[0] == 'w');
    static char got[KEYS * 24];
    size_t g = 0;
    if (due.len == 1) {
        sluice_timer_t first = {SLUICE_CLOCK_EVENT, sluice_bytes(due.ptr[0].key.ptr, due.ptr[0].key.len), 9};
        const sluice_window_t *closed = NULL;
        size_t fired = 0;
        sluice_testing_call_begin();
        OK(sluice_windows_fire(&W, &first, &closed, &fired));
        CHECK(fired == SLUICE_WINDOWS_PER_FIRING);
        for (size_t i = 0; i < fired; i++)
            g += (size_t)snprintf(got + g, sizeof got - g, "%.*s=%" PRId64 " %" PRId64 " %.*s\n", (int)closed[i].key.len,
                                  (const char *)closed[i].key.ptr, closed[i].start, closed[i].end,
                                  (int)closed[i].value.len, (const char *)closed[i].value.ptr);
        sluice_testing_call_finish();
    }
    packed_out_list_timer_free(&due);
    char resume[32];
    int rlen = snprintf(resume, sizeof resume, "w\001%s", keys[SLUICE_WINDOWS_PER_FIRING - 1]);
    /* The rest go on after the last key fired. */
    CHECK(host_timers_pending() == 2);
    CHECK(host_has_timer(SLUICE_CLOCK_EVENT, resume, (size_t)rlen, 9) && host_has_timer(SLUICE_CLOCK_EVENT, "w", 1, 19));

    /* Every key's window once, in key order, over three firings (64, 64, 5). */
    static char want[KEYS * 24];
    size_t n = 0;
    for (int i = 0; i < KEYS; i++) n += (size_t)snprintf(want + n, sizeof want - n, "%s=0 10 1\n", keys[i]);
    snprintf(got + g, sizeof got - g, "%s", advance_watermark(9));
    RESULT_IS(got, want);
    CHECK(host_calls.scan_prefix == 3);
    CHECK(host_timers_pending() == 1 && host_has_timer(SLUICE_CLOCK_EVENT, "w", 1, 19));
    CHECK(host_state_count("w\0\0\0\0\x08\x80\0\0\0\0\0\0\0", 14) == 0);

    n = 0;
    for (int i = 0; i < KEYS; i++) n += (size_t)snprintf(want + n, sizeof want - n, "%s=10 20 1\n", keys[i]);
    RESULT_IS(advance_watermark(19), want);
    CHECK(host_timers_pending() == 0);
    CHECK(host_state_total() == 0);
}

static void test_a_window_stored_per_key_by_an_older_sdk_still_fires_once(void) {
    reset();
    fire_through(&W);
    CHECK(init_with(NULL, 0));
    /* The layout of earlier SDKs: map entry (`w`, key, start) and a timer
     * `w 0x00 key` per key. */
    static const char old[] = "w\0\0\0\0\001k\x80\0\0\0\0\0\0\0";
    host_state_put(old, sizeof old - 1, "4", 1);
    sluice_testing_call_begin();
    OK(sluice_timer_set(SLUICE_CLOCK_EVENT, sluice_bytes("w\0k", 3), 9));
    sluice_testing_call_finish();
    CHECK(add_count(&W, "n", 5) == 1); /* the same window end, stored the new way */
    RESULT_IS(advance_watermark(9), "n=0 10 1\nk=0 10 4\n");
    CHECK(STORED(old, NULL)); /* its state is removed */
    CHECK(host_timers_pending() == 0 && host_state_total() == 0);

    const sluice_window_t *closed;
    size_t n = 99;
    sluice_timer_t again = {SLUICE_CLOCK_EVENT, sluice_bytes("w\0k", 3), 9};
    sluice_testing_call_begin();
    OK(sluice_windows_fire(&W, &again, &closed, &n));
    CHECK(n == 0); /* once */
    sluice_testing_call_finish();
}

static const sluice_windows_t LATE = {.name = "l", .size_ms = 10, .slide_ms = 10, .lateness_ms = 5};

static void test_allowed_lateness(void) {
    reset();
    fire_through(&LATE);
    CHECK(init_with(NULL, 0));
    CHECK(add_count(&LATE, "k", 2) == 1);
    CHECK(host_has_timer(SLUICE_CLOCK_EVENT, "l", 1, 14)); /* end - 1 + lateness */
    RESULT_IS(advance_watermark(12), "");
    CHECK(add_count(&LATE, "k", 3) == 1); /* late, within the allowed lateness */
    RESULT_IS(advance_watermark(14), "k=0 10 2\n");
    CHECK(add_count(&LATE, "k", 4) == 0);
}

/* A fold that appends the timestamp in ctx to a JSON array. */
static int push_ts(const sluice_bytes_t *acc, sluice_buf_t *out, void *ctx) {
    int64_t ts = *(const int64_t *)ctx;
    if (!acc) {
        sluice_buf_printf(out, "[%" PRId64 "]", ts);
    } else {
        sluice_buf_append(out, acc->ptr, acc->len - 1);
        sluice_buf_printf(out, ",%" PRId64 "]", ts);
    }
    return SLUICE_OK;
}

static const sluice_windows_t HOPPING = {.name = "h", .size_ms = 10, .slide_ms = 5};

static void test_hopping_windows(void) {
    reset();
    fire_through(&HOPPING);
    CHECK(init_with(NULL, 0));
    int64_t ts = 7;
    size_t added;
    sluice_testing_call_begin();
    OK(sluice_windows_add(&HOPPING, sluice_str("k"), ts, push_ts, &ts, &added));
    CHECK(added == 2); /* [0, 10) and [5, 15) */
    ts = 12;
    OK(sluice_windows_add(&HOPPING, sluice_str("k"), ts, push_ts, &ts, &added));
    CHECK(added == 2); /* [5, 15) and [10, 20) */
    sluice_testing_call_finish();
    RESULT_IS(advance_watermark(30), "k=0 10 [7]\nk=5 15 [7,12]\nk=10 20 [12]\n");
}

static const sluice_sessions_t SESSIONS = {.name = "s", .gap_ms = 10};
static int fire_sessions(const sluice_timer_t *t, const sluice_window_t **closed, size_t *n) {
    static sluice_window_t w;
    bool fired;
    if (sluice_sessions_fire(&SESSIONS, t, &w, &fired)) return SLUICE_ERR;
    *closed = &w;
    *n = fired ? 1 : 0;
    return SLUICE_OK;
}

static bool add_session(int64_t ts) {
    bool added = false;
    sluice_testing_call_begin();
    OK(sluice_sessions_add(&SESSIONS, sluice_str("k"), ts, sluice_fold_count, sluice_merge_sum, NULL, &added));
    sluice_testing_call_finish();
    return added;
}

static void test_sessions(void) {
    reset();
    on_timer = fire_hook;
    firing = fire_sessions;
    CHECK(init_with(NULL, 0));
    CHECK(add_session(0));
    CHECK(add_session(5)); /* extends [0, 10) to [0, 15) */
    CHECK(add_session(22)); /* a new session [22, 32) */
    CHECK(host_timers_pending() == 2);
    CHECK(STORED("s\0k", "[{\"start\":0,\"end\":15,\"value\":2},{\"start\":22,\"end\":32,\"value\":1}]"));
    CHECK(add_session(13)); /* bridges both: one session [0, 32) */
    CHECK(host_timers_pending() == 1);
    CHECK(host_has_timer(SLUICE_CLOCK_EVENT, "s\0k", 3, 31));
    CHECK(STORED("s\0k", "[{\"start\":0,\"end\":32,\"value\":4}]"));
    RESULT_IS(advance_watermark(30), "");
    RESULT_IS(advance_watermark(31), "k=0 32 4\n");
    CHECK(STORED("s\0k", NULL));
    CHECK(!add_session(21)); /* its session would have closed already */
    CHECK(add_session(45));
    CHECK(add_session(70));
    RESULT_IS(advance_watermark(60), "k=45 55 1\n");
    CHECK(STORED("s\0k", "[{\"start\":70,\"end\":80,\"value\":1}]"));

    /* Stored JSON from another SDK may order fields differently. */
    host_set_watermark(false, 0);
    host_state_put("s\0j", 3, "[ {\"value\":5, \"end\":9,\"start\":1} ]", 34);
    sluice_testing_call_begin();
    bool added;
    OK(sluice_sessions_add(&SESSIONS, sluice_str("j"), 3, sluice_fold_count, sluice_merge_sum, NULL, &added));
    sluice_testing_call_finish();
    CHECK(STORED("s\0j", "[{\"start\":1,\"end\":13,\"value\":6}]"));
    host_state_put("s\0bad", 5, "{\"start\":1}", 11);
    sluice_testing_call_begin();
    CHECK(sluice_sessions_add(&SESSIONS, sluice_str("bad"), 3, sluice_fold_count, sluice_merge_sum, NULL, &added) == SLUICE_ERR);
    CHECK(strcmp(sluice_last_error(), "state `s`: invalid JSON: expected an array of {\"start\", \"end\", \"value\"}") == 0);
    sluice_testing_call_finish();
}

/* ---- the windowed-count example, natively ------------------------------ */

static sluice_windows_t wc;

static int wc_init(const sluice_config_t *c) {
    int64_t size, lateness;
    if (sluice_config_duration_ms(c, "window", 60000, &size) || sluice_config_duration_ms(c, "allowed-lateness", 0, &lateness))
        return SLUICE_ERR;
    wc = sluice_windows_allowed_lateness(sluice_windows_tumbling("count", size), lateness);
    return SLUICE_OK;
}
static int wc_record(const sluice_record_t *r, sluice_emitter_t *out) {
    (void)out;
    return sluice_windows_add_record(&wc, r, sluice_fold_count, NULL, NULL);
}

static void test_windowed_count_golden(void) {
    reset();
    on_init = wc_init;
    on_record = wc_record;
    fire_through(&wc);
    CHECK(init_with(NULL, 0));
    rec_t b[] = {R("alice", "click", 1000), R("bob", "click", 2000), R("bob", "click", 30000), R("alice", "click", 59999),
                 R("alice", "click", 60000), R("bob", "click", 61000)};
    RESULT_IS(process(b, 6), "");
    RESULT_IS(advance_watermark(60999), "alice=0 60000 2\nbob=0 60000 2\n");
    rec_t late[] = {R("bob", "late", 59000), R("alice", "click", 125000)};
    RESULT_IS(process(late, 2), "");
    RESULT_IS(advance_watermark(INT64_MAX), "alice=60000 120000 1\nbob=60000 120000 1\nalice=120000 180000 1\n");
    CHECK(host_state_total() == 0);
    rec_t none[] = {{"k", "v", false, 0}};
    RESULT_IS(process(none, 1), "ERR record in-0@8: record in-0@8 has no timestamp, so it falls in no event-time window");
}

/* Batches of 7 over 13 keys, windows fired between them: every add reads
 * its window with a single `state.get` and rewrites it in place. */
static void test_windowed_count_in_small_batches(void) {
    reset();
    on_init = wc_init;
    on_record = wc_record;
    fire_through(&wc);
    const char *config[] = {"window", "1s"};
    CHECK(init_with(config, 1));
    static char keys[13][16];
    for (int k = 0; k < 13; k++) snprintf(keys[k], sizeof keys[k], "key-%d", k);
    size_t fired = 0;
    for (int i = 0; i < 2000; i += 7) {
        rec_t b[7];
        int n = 0;
        for (; n < 7 && i + n < 2000; n++) b[n] = (rec_t)R(keys[(i + n) % 13], "click", (int64_t)(i + n) * 7);
        RESULT_IS(process(b, (size_t)n), "");
        const char *got = advance_watermark((int64_t)(i + n - 1) * 7);
        CHECK(strncmp(got, "ERR", 3) != 0);
        for (const char *p = got; *p; p++) fired += *p == '\n';
    }
    CHECK(fired == 13 * 13); /* 13 closed windows (0..13 s) of 13 keys each */
}

/* ---- time-to-live ------------------------------------------------------ */

static const sluice_value_state_t SEEN = {.name = "seen", .ttl_ms = 100};
static const sluice_map_state_t CART = {.name = "cart", .ttl_ms = 100};

static void test_ttl_value(void) {
    reset();
    CHECK(init_with(NULL, 0));
    host_set_now(1000);
    sluice_bytes_t json;
    bool found;
    uint64_t n;
    sluice_testing_call_begin();
    OK(sluice_value_set_u64(&SEEN, sluice_str("a"), 1));
    OK(sluice_value_get_u64(&SEEN, sluice_str("a"), &n, &found));
    CHECK(found && n == 1);
    sluice_testing_call_finish();
    CHECK(STORED("seen\0a", "[1100,1]"));
    CHECK(host_has_timer(SLUICE_CLOCK_PROCESSING, "\0ttl\0seen\0a", 11, 1100));

    host_set_now(1099);
    RESULT_IS(fire_due(), "");
    sluice_testing_call_begin();
    OK(sluice_value_get_json(&SEEN, sluice_str("a"), &json, &found));
    CHECK(found && BYTES_IS(json, "1"));
    sluice_testing_call_finish();

    host_set_now(1100);
    sluice_testing_call_begin();
    OK(sluice_value_get_json(&SEEN, sluice_str("a"), &json, &found));
    CHECK(!found); /* expired: not returned, even before its timer fired */
    OK(sluice_value_add_u64(&SEEN, sluice_str("a"), 10, &n));
    CHECK(n == 10); /* an update starts afresh */
    sluice_testing_call_finish();
    RESULT_IS(fire_due(), ""); /* the first timer finds a newer expiry and keeps the entry */
    CHECK(STORED("seen\0a", "[1200,10]"));
    host_set_now(1200);
    RESULT_IS(fire_due(), "");
    CHECK(STORED("seen\0a", NULL)); /* removed from the store */
    CHECK(host_timers_pending() == 0);

    host_state_put("seen\0b", 6, "5", 1);
    sluice_testing_call_begin();
    CHECK(sluice_value_get_json(&SEEN, sluice_str("b"), &json, &found) == SLUICE_ERR);
    CHECK(strcmp(sluice_last_error(), "state `seen`: invalid JSON: expected [expires_at, value], a state with a time-to-live") == 0);
    sluice_testing_call_finish();
}

typedef struct {
    char text[512];
    size_t n;
} joined_t;

static int join_entry(sluice_bytes_t mk, sluice_bytes_t json, void *ctx) {
    joined_t *j = ctx;
    j->n += snprintf(j->text + j->n, sizeof j->text - j->n, "%.*s:%.*s;", (int)mk.len, (const char *)mk.ptr, (int)json.len,
                     (const char *)json.ptr);
    return SLUICE_OK;
}

static void test_ttl_map(void) {
    reset();
    CHECK(init_with(NULL, 0));
    sluice_testing_call_begin();
    OK(sluice_map_set_json(&CART, sluice_str("u"), sluice_str("apple"), sluice_str("1")));
    sluice_testing_call_finish();
    host_set_now(50);
    sluice_testing_call_begin();
    OK(sluice_map_set_json(&CART, sluice_str("u"), sluice_str("pear"), sluice_str("2")));
    sluice_testing_call_finish();
    CHECK(STORED("cart\0\0\0\0\001upear", "[150,2]"));
    host_set_now(120);
    sluice_testing_call_begin();
    sluice_bytes_t json;
    bool found;
    OK(sluice_map_get_json(&CART, sluice_str("u"), sluice_str("apple"), &json, &found));
    CHECK(!found);
    joined_t j = {{0}, 0};
    OK(sluice_map_foreach(&CART, sluice_str("u"), join_entry, &j));
    CHECK(strcmp(j.text, "pear:2;") == 0);
    sluice_testing_call_finish();
    CHECK(host_state_count("cart", 4) == 2); /* expired, but its timer has not fired */
    RESULT_IS(fire_due(), "");
    CHECK(host_state_count("cart", 4) == 1); /* the expiry timer removed it: state bytes go down */
    host_set_now(150);
    RESULT_IS(fire_due(), "");
    CHECK(host_state_count("cart", 4) == 0);
}

/* ---- map and list state ------------------------------------------------ */

static const sluice_map_state_t M = {.name = "m"};

static int count_entry(sluice_bytes_t mk, sluice_bytes_t json, void *ctx) {
    (void)mk;
    (void)json;
    (*(size_t *)ctx)++;
    return SLUICE_OK;
}

static void test_map_state(void) {
    reset();
    CHECK(init_with(NULL, 0));
    uint8_t b1[8], b2[8], b3[8];
    sluice_testing_call_begin();
    OK(sluice_map_set_json(&M, sluice_str("ab"), sluice_map_key_i64(5, b1), sluice_str("\"five\"")));
    OK(sluice_map_set_json(&M, sluice_str("ab"), sluice_map_key_i64(-1, b2), sluice_str("[1,{\"x\":null}]")));
    OK(sluice_map_set_json(&M, sluice_str("a"), sluice_map_key_i64(0, b3), sluice_str("true")));
    CHECK(sluice_map_set_json(&M, sluice_str("a"), sluice_str("x"), sluice_str("{oops")) == SLUICE_ERR);
    joined_t j = {{0}, 0};
    /* Pending writes are flushed first; -1 sorts before 5. */
    OK(sluice_map_foreach(&M, sluice_str("ab"), join_entry, &j));
    CHECK(host_calls.write == 1);
    sluice_testing_call_finish();
    CHECK(memcmp(j.text, "\x7f\xff\xff\xff\xff\xff\xff\xff:[1,{\"x\":null}];", 24) == 0);
    CHECK(STORED("m\0\0\0\0\002ab\x80\0\0\0\0\0\0\x05", "\"five\""));
    CHECK(STORED("m\0\0\0\0\001a\x80\0\0\0\0\0\0\0", "true"));
    int64_t back;
    OK(sluice_map_key_decode_i64(sluice_bytes("\x7f\xff\xff\xff\xff\xff\xff\xff", 8), &back));
    CHECK(back == -1);

    /* More than one scan page; clear removes them all and not the other key's. */
    sluice_testing_call_begin();
    for (uint32_t i = 0; i < 2500; i++) {
        uint8_t b[4];
        OK(sluice_map_set_json(&M, sluice_str("big"), sluice_map_key_u32(i, b), sluice_str("0")));
    }
    size_t n = 0;
    host_calls.scan_prefix = 0;
    OK(sluice_map_foreach(&M, sluice_str("big"), count_entry, &n));
    CHECK(n == 2500 && host_calls.scan_prefix == 3);
    OK(sluice_map_clear(&M, sluice_str("big")));
    n = 0;
    OK(sluice_map_foreach(&M, sluice_str("big"), count_entry, &n));
    CHECK(n == 0);
    sluice_testing_call_finish();
    CHECK(host_state_count("m\0\0\0\0\003big", 9) == 0 && host_state_count("m\0", 2) == 3);
}

static const sluice_list_state_t L = {.name = "l"};

static int join_item(sluice_bytes_t item, void *ctx) {
    joined_t *j = ctx;
    j->n += snprintf(j->text + j->n, sizeof j->text - j->n, "<%.*s>", (int)item.len, (const char *)item.ptr);
    return SLUICE_OK;
}

static void test_list_state(void) {
    reset();
    CHECK(init_with(NULL, 0));
    sluice_bytes_t json;
    bool found;
    sluice_testing_call_begin();
    OK(sluice_list_get_json(&L, sluice_str("k"), &json, &found));
    CHECK(!found && BYTES_IS(json, "[]"));
    OK(sluice_list_push_json(&L, sluice_str("k"), sluice_str("[1,\"a\"]")));
    OK(sluice_list_push_json(&L, sluice_str("k"), sluice_str("{\"a\":[3]}")));
    joined_t j = {{0}, 0};
    OK(sluice_list_foreach(&L, sluice_str("k"), join_item, &j));
    CHECK(strcmp(j.text, "<[1,\"a\"]><{\"a\":[3]}>") == 0);
    sluice_testing_call_finish();
    CHECK(STORED("l\0k", "[[1,\"a\"],{\"a\":[3]}]"));
    host_state_put("l\0s", 3, " [ ] \n", 6);
    host_state_put("l\0n", 3, "5", 1);
    sluice_testing_call_begin();
    OK(sluice_list_push_json(&L, sluice_str("s"), sluice_str("1")));
    CHECK(sluice_list_push_json(&L, sluice_str("n"), sluice_str("1")) == SLUICE_ERR);
    CHECK(strcmp(sluice_last_error(), "state `l`: stored value is not a JSON array") == 0);
    OK(sluice_list_set_json(&L, sluice_str("t"), sluice_str("[9]")));
    CHECK(sluice_list_set_json(&L, sluice_str("t"), sluice_str("9")) == SLUICE_ERR);
    OK(sluice_list_clear(&L, sluice_str("k")));
    sluice_testing_call_finish();
    CHECK(STORED("l\0s", "[ 1]"));
    CHECK(STORED("l\0t", "[9]"));
    CHECK(STORED("l\0k", NULL));
}

/* ---- migrate ----------------------------------------------------------- */

static int migrate_v1(sluice_bytes_t from) {
    if (!sluice_bytes_eq(from, "old")) return sluice_error("cannot migrate from %.*s", (int)from.len, (const char *)from.ptr);
    /* v1 kept plain counts under `v1 0x00 key`; v2 keeps them with a TTL. */
    sluice_value_state_t old = {.name = "v1"}, new = {.name = "v2", .ttl_ms = 1000};
    uint64_t n;
    bool found;
    if (sluice_value_get_u64(&old, sluice_str("k"), &n, &found)) return SLUICE_ERR;
    if (!found) return SLUICE_OK;
    if (sluice_value_set_u64(&new, sluice_str("k"), n)) return SLUICE_ERR;
    return sluice_value_clear(&old, sluice_str("k"));
}

static const char *migrate(const char *from) {
    packed_out_list_u8_t f = list(from, strlen(from));
    packed_out_string_t arg = {f.ptr, f.len}, err = {0};
    bool ok = exports_packed_out_migrate(&arg, &err);
    snprintf(result, sizeof result, ok ? "OK" : "ERR %.*s", (int)err.len, (const char *)err.ptr);
    if (!ok) packed_out_string_free(&err);
    return result;
}

static void test_migrate(void) {
    reset();
    on_migrate = migrate_v1;
    CHECK(init_with(NULL, 0));
    host_state_put("v1\0k", 4, "7", 1);
    host_set_now(5);
    RESULT_IS(migrate("other"), "ERR cannot migrate from other");
    CHECK(STORED("v1\0k", "7"));
    RESULT_IS(migrate("old"), "OK");
    CHECK(STORED("v1\0k", NULL));
    CHECK(STORED("v2\0k", "[1005,7]"));
    CHECK(host_calls.write == 1); /* written back once */
    CHECK(host_has_timer(SLUICE_CLOCK_PROCESSING, "\0ttl\0v2\0k", 9, 1005));
}

/* ---- config ------------------------------------------------------------ */

static int64_t duration(const char *text) {
    int64_t ms = -1;
    if (sluice_parse_duration_ms(sluice_str(text), &ms)) return -1;
    return ms;
}

static int bad_window_init(const sluice_config_t *c) {
    int64_t ms;
    return sluice_config_duration_ms(c, "window", 1, &ms);
}

static void test_durations(void) {
    CHECK(duration("10s") == 10000);
    CHECK(duration("1m") == 60000);
    CHECK(duration("1m 30s") == 90000);
    CHECK(duration("1m30s") == 90000);
    CHECK(duration(" 500ms ") == 500);
    CHECK(duration("2h") == 7200000);
    CHECK(duration("1500us") == 1);
    CHECK(duration("999999ns") == 0);
    CHECK(duration("1d") == 86400000);
    CHECK(duration("1 minute") == 60000);
    CHECK(duration("0s") == 0);
    CHECK(duration("") == -1 && strcmp(sluice_last_error(), "empty duration") == 0);
    CHECK(duration("10") == -1);
    CHECK(duration("s") == -1 && strcmp(sluice_last_error(), "expected a number at 0") == 0);
    CHECK(duration("99999999999999999999999s") == -1 && strcmp(sluice_last_error(), "number is too large") == 0);
    reset();
    on_init = bad_window_init;
    const char *cfg[] = {"window", "5x"};
    packed_out_list_tuple2_string_string_t c = {malloc(sizeof *c.ptr), 1};
    packed_out_list_u8_t k = list(cfg[0], 6), v = list(cfg[1], 2);
    c.ptr[0].f0 = (packed_out_string_t){k.ptr, k.len};
    c.ptr[0].f1 = (packed_out_string_t){v.ptr, v.len};
    packed_out_string_t err = {0};
    CHECK(!exports_packed_out_init(&c, &err));
    snprintf(result, sizeof result, "%.*s", (int)err.len, (const char *)err.ptr);
    packed_out_string_free(&err);
    RESULT_IS(result, "config key `window`: invalid duration \"5x\" (e.g. 10s, 1m, 500ms): unknown time unit \"x\", "
                      "supported units: ns, us, ms, s, m, h, d, w, M, y");
}

static void test_number_text(void) {
    char buf[21];
    CHECK(BYTES_IS(sluice_u64_text(0, buf), "0") && buf[1] == 0);
    CHECK(BYTES_IS(sluice_u64_text(10, buf), "10"));
    CHECK(BYTES_IS(sluice_u64_text(UINT64_MAX, buf), "18446744073709551615") && buf[20] == 0);
    CHECK(BYTES_IS(sluice_i64_text(0, buf), "0"));
    CHECK(BYTES_IS(sluice_i64_text(-1, buf), "-1"));
    CHECK(BYTES_IS(sluice_i64_text(INT64_MAX, buf), "9223372036854775807"));
    CHECK(BYTES_IS(sluice_i64_text(INT64_MIN, buf), "-9223372036854775808") && buf[20] == 0);
}

static void test_json(void) {
    const char *good[] = {"0", "-1", "1.5e3", "\"a\\u00e9\\n\"", "[]", " [1, [2, {}]] ", "{\"a\":null,\"b\":[true,false]}"};
    const char *bad[] = {"", "01", "[1,]", "{\"a\"}", "\"\\x\"", "tru", "[1] 2", "{1:2}", "-", "1."};
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) CHECK(sluice_json_valid(sluice_str(good[i])));
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) CHECK(!sluice_json_valid(sluice_str(bad[i])));
    uint64_t u;
    int64_t s;
    OK(sluice_json_u64(sluice_str("18446744073709551615"), &u));
    CHECK(u == UINT64_MAX);
    CHECK(sluice_json_u64(sluice_str("-1"), &u) == SLUICE_ERR);
    OK(sluice_json_i64(sluice_str("-9223372036854775808"), &s));
    CHECK(s == INT64_MIN);
    sluice_buf_t b = {0};
    sluice_buf_append_json_string(&b, sluice_bytes("a\"\\\n\001", 5));
    CHECK(BYTES_IS(sluice_buf_bytes(&b), "\"a\\\"\\\\\\n\\u0001\""));
    sluice_buf_free(&b);
}


/* ---- held state (world `cached`) ---------------------------------------
 * Once the host calls `hold-state`, a shard's cache stays from one batch of
 * the shard to the next, within the bytes the host allows, until its
 * `flush-state` for the shard. The fake host scopes state to the shard. */

static const sluice_map_state_t LAST = {.name = "last"};
static const sluice_list_state_t PUSHED = {.name = "pushed"};

static int count_entries(sluice_bytes_t map_key, sluice_bytes_t json, void *ctx) {
    (void)map_key;
    (void)json;
    ++*(int *)ctx;
    return SLUICE_OK;
}

/* A running count that also writes a map entry, pushes to a list every
 * third record of a key and scans the map every fourth (a scan flushes the
 * call's writes first). */
static int hold_record(const sluice_record_t *r, sluice_emitter_t *out) {
    sluice_bytes_t key = sluice_record_key_or_empty(r), value = sluice_record_value_or_empty(r);
    if (sluice_bytes_eq(value, "fail")) return sluice_error("asked to fail");
    uint64_t n;
    char text[21], json[80];
    if (sluice_value_add_u64(&COUNTS, key, 1, &n)) return SLUICE_ERR;
    snprintf(json, sizeof json, "\"%.*s\"", (int)value.len, (const char *)value.ptr);
    if (sluice_map_set_json(&LAST, key, sluice_str("v"), sluice_str(json))) return SLUICE_ERR;
    if (n % 3 == 0 && sluice_list_push_json(&PUSHED, key, sluice_u64_text(n, text))) return SLUICE_ERR;
    int entries = 0;
    if (n % 4 == 0 && (sluice_map_foreach(&LAST, key, count_entries, &entries) || entries != 1)) {
        return sluice_error("the scan saw %d entries", entries);
    }
    return sluice_emit(out, key, sluice_u64_text(n, text));
}

static int prefetch_counts(const sluice_batch_t *b) { return sluice_value_prefetch(&COUNTS, b); }

static void hold_start(uint64_t max_bytes, bool hold) {
    reset();
    via = VIA_PACKED_OUT;
    on_record = hold_record;
    on_begin = prefetch_counts;
    CHECK(init_with(NULL, 0));
    if (hold) exports_packed_out_hold_state(max_bytes);
}

/* One batch of `shard` over the keys in `keys` (one char each). */
static const char *hold_batch(uint32_t shard, const char *keys, const char *value) {
    full_rec_t full[64];
    size_t n = strlen(keys);
    char key_text[64][2];
    for (size_t i = 0; i < n && i < 64; i++) {
        key_text[i][0] = keys[i];
        key_text[i][1] = 0;
        full[i] = (full_rec_t){{key_text[i], value, false, 0}, "in", NULL, NULL};
    }
    host_use_shard(shard);
    return process_full(full, n, (int32_t)shard);
}

static void hold_flush(uint32_t shard) {
    packed_out_string_t err = {0};
    host_use_shard(shard);
    CHECK(exports_packed_out_flush_state(shard, &err));
}

/* Every shard's stored entries, "shard:key=value;" in order. */
static void hold_snapshot(char *out, size_t cap) {
    size_t n = 0;
    out[0] = 0;
    for (uint32_t shard = 0; shard < 3; shard++) {
        host_use_shard(shard);
        sluice_bytes_t k, v;
        for (size_t i = 0; host_state_entry(i, &k, &v) && n < cap; i++) {
            n += (size_t)snprintf(out + n, cap - n, "%u:", shard);
            for (size_t j = 0; j < k.len && n < cap; j++) out[n++] = k.ptr[j] ? (char)k.ptr[j] : '|';
            if (n < cap) n += (size_t)snprintf(out + n, cap - n, "=%.*s;", (int)v.len, (const char *)v.ptr);
        }
    }
    if (n >= cap) out[cap - 1] = 0;
}

static void test_a_held_shard_reaches_the_host_only_when_asked_for(void) {
    hold_start(1 << 20, true);
    RESULT_IS(hold_batch(0, "aba", "x"), "a=1\nb=1\na=2\n");
    RESULT_IS(hold_batch(0, "ac", "x"), "a=3\nc=1\n");
    RESULT_IS(hold_batch(0, "bb", "x"), "b=2\nb=3\n");
    CHECK(host_calls.write == 0 && host_state_total() == 0); /* nothing before flush-state */
    hold_flush(0);
    CHECK(host_calls.write == 1); /* one write for the three batches */
    CHECK(STORED("count\0a", "3") && STORED("count\0b", "3") && STORED("count\0c", "1"));
    CHECK(STORED("pushed\0a", "[3]") && STORED("pushed\0b", "[3]"));
    hold_flush(0); /* nothing held: nothing more */
    CHECK(host_calls.write == 1);
}

static void test_shards_are_held_apart_and_flushed_alone(void) {
    hold_start(1 << 20, true);
    RESULT_IS(hold_batch(0, "k", "x"), "k=1\n");
    RESULT_IS(hold_batch(1, "kk", "x"), "k=1\nk=2\n");
    RESULT_IS(hold_batch(0, "k", "x"), "k=2\n");
    hold_flush(1);
    CHECK(STORED("count\0k", "2"));
    host_use_shard(0);
    CHECK(host_state_total() == 0); /* only shard 1 is written */
    RESULT_IS(hold_batch(1, "k", "x"), "k=3\n"); /* read back from the host */
    RESULT_IS(hold_batch(0, "k", "x"), "k=3\n"); /* still held */
    hold_flush(0);
    hold_flush(1);
    CHECK(STORED("count\0k", "3"));
    host_use_shard(0);
    CHECK(STORED("count\0k", "3"));
}

static void test_over_its_bytes_a_shard_is_written_back_after_the_batch(void) {
    hold_start(1, true);
    RESULT_IS(hold_batch(0, "a", "x"), "a=1\n");
    CHECK(STORED("count\0a", "1")); /* written back at once */
    RESULT_IS(hold_batch(0, "a", "x"), "a=2\n");
    hold_flush(0);
    CHECK(host_calls.write == 2);
}

/* What is held counts against the budget over all shards: with room for
 * one shard's cache and not two, a second shard's batch is written back at
 * once while the first stays held. */
static void test_a_shard_over_what_is_left_is_written_back_while_another_stays_held(void) {
    hold_start(1 << 20, true);
    hold_batch(0, "a", "x");
    size_t one = sluice_testing_held_bytes();
    exports_packed_out_hold_state(one + 64);
    RESULT_IS(hold_batch(1, "a", "x"), "a=1\n");
    CHECK(host_calls.write == 1 && STORED("count\0a", "1")); /* shard 1, at once */
    host_use_shard(0);
    CHECK(host_state_total() == 0); /* shard 0 still held */
    hold_flush(0);
    CHECK(STORED("count\0a", "1"));
}

static void test_a_failed_batch_drops_what_every_shard_held(void) {
    hold_start(1 << 20, true);
    hold_batch(0, "a", "x");
    hold_batch(1, "a", "x");
    RESULT_IS(hold_batch(1, "ab", "fail"), "ERR record in-1@2: asked to fail");
    hold_flush(0);
    hold_flush(1);
    char snap[256];
    hold_snapshot(snap, sizeof snap);
    CHECK(strcmp(snap, "") == 0); /* the host rolls the epoch back: nothing held reaches it */
}

static void test_timers_and_unheld_calls_leave_a_held_shard_alone(void) {
    hold_start(1 << 20, true);
    hold_batch(0, "aa", "x");
    RESULT_IS(fire_due(), ""); /* an on-timers call */
    packed_out_list_u8_t from = list("old", 3);
    packed_out_string_t from_module = {from.ptr, from.len}, err = {0};
    CHECK(exports_packed_out_migrate(&from_module, &err)); /* another call without a shard */
    CHECK(host_state_total() == 0);
    RESULT_IS(hold_batch(0, "a", "x"), "a=3\n");
    hold_flush(0);
    CHECK(STORED("count\0a", "3"));
}

/* Random batches and flushes over three shards, held within budgets from
 * one byte to all, end with the stores and outputs of a store that holds
 * nothing. */
static void test_random_calls_end_as_a_store_that_holds_nothing_does(void) {
    static char outs[2][65536], snaps[2][65536];
    uint64_t seed = 7;
    for (int round = 0; round < 25; round++) {
        uint64_t budgets[] = {1, 2000, 20000, UINT64_MAX};
        uint64_t budget = 0;
        uint64_t start = seed;
        for (int pass = 0; pass < 2; pass++) {
            seed = start;
#define RAND(n) ((uint32_t)((seed = seed * 6364136223846793005u + 1442695040888963407u) >> 33) % (n))
            budget = budgets[RAND(4)];
            hold_start(budget, pass == 0);
            size_t o = 0;
            bool held[3] = {false, false, false};
            for (int step = 0; step < 60; step++) {
                uint32_t shard = RAND(3);
                if (RAND(100) < 15) {
                    if (pass == 0) hold_flush(shard), held[shard] = false;
                    continue;
                }
                char keys[9], value[50];
                size_t n = 1 + RAND(8), len = RAND(49);
                for (size_t i = 0; i < n; i++) keys[i] = (char)('a' + RAND(8));
                keys[n] = 0;
                memset(value, 'v', len);
                value[len] = 0;
                o += (size_t)snprintf(outs[pass] + o, sizeof outs[pass] - o, "%s|", hold_batch(shard, keys, value));
                held[shard] = pass == 0;
                CHECK(sluice_testing_sizes_add_up());
            }
#undef RAND
            for (uint32_t shard = 0; shard < 3; shard++)
                if (held[shard]) hold_flush(shard);
            hold_snapshot(snaps[pass], sizeof snaps[pass]);
        }
        CHECK(strcmp(outs[0], outs[1]) == 0);
        if (strcmp(snaps[0], snaps[1]) != 0) fprintf(stderr, "  round %d, budget %" PRIu64 "\n", round, budget);
        CHECK(strcmp(snaps[0], snaps[1]) == 0);
    }
}

int main(void) {
    test_running_count_and_failed_batches();
    test_packed_and_listed_batches_agree();
    test_every_output_shape_through_every_export();
    test_prefetch_reads_a_batch_with_one_get_many_and_writes_back_once();
    test_keys_of_a_failed_prefetch_are_read_from_the_host();
    test_timers();
    test_timers_need_a_shard();
    test_tumbling_windows();
    test_window_timers_once_per_call();
    test_one_timer_per_window_end_closes_every_keys_window_in_pages();
    test_a_window_stored_per_key_by_an_older_sdk_still_fires_once();
    test_allowed_lateness();
    test_hopping_windows();
    test_sessions();
    test_windowed_count_golden();
    test_windowed_count_in_small_batches();
    test_ttl_value();
    test_ttl_map();
    test_map_state();
    test_list_state();
    test_migrate();
    test_durations();
    test_json();
    test_number_text();
    test_a_held_shard_reaches_the_host_only_when_asked_for();
    test_shards_are_held_apart_and_flushed_alone();
    test_over_its_bytes_a_shard_is_written_back_after_the_batch();
    test_a_shard_over_what_is_left_is_written_back_while_another_stays_held();
    test_a_failed_batch_drops_what_every_shard_held();
    test_timers_and_unheld_calls_leave_a_held_shard_alone();
    test_random_calls_end_as_a_store_that_holds_nothing_does();
    exports_packed_out_hold_state(0);
    host_reset();
    printf("test_sluice: %d checks, %d failed\n", checks, failures);
    return failures ? 1 : 0;
}
