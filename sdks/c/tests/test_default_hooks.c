/*
 * A transform with only the required hooks (init, process): the SDK's
 * defaults for begin/end batch, on_timer and migrate. A timer firing
 * without an on_timer hook fails the call with a message saying what to
 * define; time-to-live timers still work (the SDK handles them itself).
 */
#include <stdio.h>
#include <stdlib.h>

#include "fake_host.h"

static const sluice_value_state_t SEEN = {.name = "seen", .ttl_ms = 10};

int sluice_transform_init(const sluice_config_t *c) {
    (void)c;
    return SLUICE_OK;
}

int sluice_transform_process(const sluice_record_t *r, sluice_emitter_t *out) {
    (void)out;
    if (sluice_value_set_json(&SEEN, sluice_record_key_or_empty(r), sluice_str("1"))) return SLUICE_ERR;
    if (sluice_bytes_eq(sluice_record_value_or_empty(r), "timer"))
        return sluice_timer_set(SLUICE_CLOCK_EVENT, sluice_str("mine"), 5);
    return SLUICE_OK;
}

static int failures;
#define CHECK(c)                                                         \
    do {                                                                 \
        if (!(c)) {                                                      \
            failures++;                                                  \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #c); \
        }                                                                \
    } while (0)

static bool process_one(const char *value) {
    packed_out_list_input_record_t batch = {calloc(1, sizeof(packed_out_input_record_t)), 1};
    batch.ptr[0].key.is_some = true;
    batch.ptr[0].key.val = (packed_out_list_u8_t){(uint8_t *)strdup("k"), 1};
    batch.ptr[0].value.is_some = true;
    batch.ptr[0].value.val = (packed_out_list_u8_t){(uint8_t *)strdup(value), strlen(value)};
    packed_out_list_output_record_t outs = {0};
    packed_out_string_t err = {0};
    bool ok = exports_packed_out_process(&batch, &outs, &err);
    if (ok) packed_out_list_output_record_free(&outs);
    else packed_out_string_free(&err);
    return ok;
}

static bool fire(char *msg, size_t len) {
    packed_out_list_timer_t due = host_take_due();
    packed_out_list_output_record_t outs = {0};
    packed_out_string_t err = {0};
    bool ok = exports_packed_out_on_timers(&due, &outs, &err);
    msg[0] = 0;
    if (ok) {
        packed_out_list_output_record_free(&outs);
    } else {
        snprintf(msg, len, "%.*s", (int)err.len, (const char *)err.ptr);
        packed_out_string_free(&err);
    }
    return ok;
}

int main(void) {
    host_reset();
    packed_out_list_tuple2_string_string_t cfg = {NULL, 0};
    packed_out_string_t err = {0};
    packed_out_string_t early = {(uint8_t *)strdup("abc"), 3};
    CHECK(!exports_packed_out_migrate(&early, &err));
    CHECK(err.len == 26 && memcmp(err.ptr, "migrate called before init", 26) == 0);
    packed_out_string_free(&err);
    CHECK(exports_packed_out_init(&cfg, &err));
    packed_out_string_t from = {(uint8_t *)strdup("abc"), 3};
    CHECK(exports_packed_out_migrate(&from, &err)); /* the default keeps the state */
    CHECK(process_one("x"));
    host_set_now(10);
    char msg[512];
    CHECK(fire(msg, sizeof msg)); /* only TTL timers: the SDK's own, no hook needed */
    CHECK(host_state_count("seen", 4) == 0);
    CHECK(process_one("timer"));
    host_set_watermark(true, 5);
    CHECK(!fire(msg, sizeof msg));
    CHECK(strstr(msg, "timer Event \"mine\"@5: a timer fired, but the transform defines no on-timer hook") == msg);
    host_reset();
    printf("test_default_hooks: %s\n", failures ? "FAILED" : "ok");
    return failures ? 1 : 0;
}
