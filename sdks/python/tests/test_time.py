"""Event time, timers, windows and state time-to-live, outside a component
(``sluice.testing`` simulates the host's clock and timers). Mirrors the Rust
SDK's guest-sdk/src/window/tests.rs, state/ttl.rs and time.rs, byte for byte
where state is concerned, and runs the windowed-count and dedup examples
against their golden testdata as ``sluice exec`` would."""

import json
import unittest

from support import ROOT, backend, input_record, reset, run_exec, wit_timer

import sluice
from sluice import (
    WINDOWS_PER_FIRING,
    Clock,
    Err,
    Error,
    MapKey,
    MapState,
    SessionWindows,
    Timer,
    Transform,
    ValueState,
    Windows,
    export,
    testing,
)


def advance(at, fire):
    """Moves the watermark to ``at`` and fires what is due through ``fire``,
    as the host would (round after round, each a new call, while firing sets
    timers that are due), collecting (key, start, end, value). ``fire``
    returns a list of windows, or (sessions) one window or ``None``."""
    testing.set_watermark(at)
    closed = []
    while True:
        due = testing.take_due()
        if not due:
            return closed
        sluice._new_call()
        for timer in due:
            fired = fire(timer)
            for w in fired if isinstance(fired, list) else [] if fired is None else [fired]:
                closed.append((w.key_str(), w.start, w.end, w.value))
        testing.finish()


def stored(windows, key, start):
    """What ``windows`` holds for ``key`` in the window starting at ``start``
    (state written back), ``None`` if nothing."""
    raw = testing.state().get(windows._window_prefix(start) + key.encode())
    return None if raw is None else json.loads(raw)


def count(n):
    return (n or 0) + 1


TUMBLING = Windows.tumbling("t", 10)


class WindowTests(unittest.TestCase):
    def setUp(self):
        reset()

    def test_a_tumbling_window_fires_once_when_the_watermark_passes_its_end(self):
        for key, ts in [("a", 1), ("a", 9), ("b", 5), ("a", 10), ("a", -1)]:
            self.assertEqual(TUMBLING.add(key, ts, count), 1)
        self.assertEqual(advance(-2, TUMBLING.fire), [])
        self.assertEqual(advance(8, TUMBLING.fire), [("a", -10, 0, 1)], "a window before 0 too")
        self.assertEqual(sorted(advance(9, TUMBLING.fire)), [("a", 0, 10, 2), ("b", 0, 10, 1)])
        self.assertEqual(TUMBLING.add("a", 3, count), 0, "its window has fired: too late")
        self.assertEqual(len(testing.pending()), 1, "only [10, 20) is open")
        self.assertEqual(advance(19, TUMBLING.fire), [("a", 10, 20, 1)])
        self.assertEqual(testing.pending(), [])
        self.assertEqual(TUMBLING.fire(Timer.event("t", 9)), [], "a fired window's state is gone")
        self.assertEqual(TUMBLING.fire(Timer.event("t\0a", 9)), [], "nor is there a window stored per key")
        self.assertEqual(TUMBLING.fire(Timer.event("other", 9)), [], "another window's timer")
        self.assertEqual(TUMBLING.fire(Timer.event("other\0a", 9)), [], "another window's per-key timer")
        self.assertEqual(TUMBLING.fire(Timer.processing("t", 19)), [], "not an event-time timer")

    def test_the_state_and_timer_layout_is_the_rust_sdks(self):
        TUMBLING.add("a", 12, count)
        TUMBLING.add("a", -5, count)
        TUMBLING.add("b", 15, count)
        TUMBLING.add("b", 11, count)
        testing.finish()
        # MapState ("t", start as an i64 map key, record key): the start
        # big-endian with the sign bit flipped, 8 bytes long.
        at = lambda start: b"t\x00\x00\x00\x00\x08" + (start + (1 << 63)).to_bytes(8, "big")  # noqa: E731
        self.assertEqual(testing.state(), {at(10) + b"a": b"1", at(-10) + b"a": b"1", at(10) + b"b": b"2"})
        self.assertEqual(at(10) + b"a", MapState("t", bytes).key(MapKey.I64.encode(10), "a"))
        self.assertEqual(
            testing.pending(), [Timer.event(b"t", -1), Timer.event(b"t", 19)], "one timer per window end, keyed `name`"
        )
        self.assertEqual((stored(TUMBLING, "a", 10), stored(TUMBLING, "b", 10), stored(TUMBLING, "b", 0)), (1, 2, None))
        late = Windows.tumbling("l", 10).allowed_lateness(5)
        late.add(b"\xff", 3, lambda v: {"n": 1, "s": "é"})
        testing.finish()
        self.assertIn(Timer.event(b"l", 14), testing.pending(), "end - 1 + lateness")
        self.assertIn('{"n":1,"s":"é"}'.encode(), testing.state().values())

    def test_allowed_lateness_keeps_a_window_open_and_still_fires_it_once(self):
        late = Windows.tumbling("l", 10).allowed_lateness(5)
        late.add("k", 2, count)
        self.assertEqual(advance(12, late.fire), [])
        self.assertEqual(late.add("k", 3, count), 1, "late, within the allowed lateness")
        self.assertEqual(advance(14, late.fire), [("k", 0, 10, 2)])

    def test_a_hopping_window_takes_each_record_into_every_window_that_holds_it(self):
        hopping = Windows.hopping("h", 10, 5)
        push = lambda ts: lambda v: (v or []) + [ts]  # noqa: E731
        self.assertEqual(hopping.add("k", 7, push(7)), 2, "in [0, 10) and [5, 15)")
        self.assertEqual(hopping.add("k", 12, push(12)), 2, "in [5, 15) and [10, 20)")
        self.assertEqual(
            advance(30, hopping.fire), [("k", 0, 10, [7]), ("k", 5, 15, [7, 12]), ("k", 10, 20, [12])]
        )

    def test_one_timer_per_window_end_closes_every_keys_window_in_pages(self):
        w = Windows.tumbling("w", 10)
        keys = [f"key-{i:04}" for i in range(WINDOWS_PER_FIRING * 2 + 5)]
        sets = testing.calls()["set_timer"]
        for key in reversed(keys):  # the order of the windows' output is the keys' own
            w.add(key, 3, count)
            w.add(key, 12, count)
        testing.finish()
        self.assertEqual(
            testing.pending(), [Timer.event("w", 9), Timer.event("w", 19)], "one timer per window end, not per key"
        )
        self.assertEqual(testing.calls()["set_timer"], sets + 2, "set once per call, not once per key")
        scans = testing.calls()["scan_prefix"]
        testing.set_watermark(9)
        due = testing.take_due()
        self.assertEqual(due, [Timer.event("w", 9)])
        sluice._new_call()
        first = w.fire(due[0])
        testing.finish()
        self.assertEqual(len(first), WINDOWS_PER_FIRING)
        last = keys[WINDOWS_PER_FIRING - 1]
        self.assertEqual(
            testing.pending(),
            [Timer.event(b"w\x01" + last.encode(), 9), Timer.event("w", 19)],
            "the rest go on after the last key fired",
        )
        closed = [(x.key_str(), x.start, x.end, x.value) for x in first] + advance(9, w.fire)
        self.assertEqual(closed, [(k, 0, 10, 1) for k in keys], "every key's window once, in key order")
        self.assertEqual(testing.calls()["scan_prefix"], scans + 3, "over three firings")
        self.assertEqual(testing.pending(), [Timer.event("w", 19)])
        self.assertEqual(len(advance(19, w.fire)), len(keys))
        self.assertEqual(testing.pending(), [])
        self.assertEqual(testing.state(), {})

    def test_a_window_end_fires_in_pages_of_windows_per_firing(self):
        w = Windows.tumbling("w", 10)
        for i in range(WINDOWS_PER_FIRING + 1):
            w.add(f"k{i:03}", 5, count)
        testing.finish()
        testing.set_watermark(9)
        (timer,) = testing.take_due()
        first = w.fire(timer)
        self.assertEqual(len(first), WINDOWS_PER_FIRING)
        self.assertEqual(
            testing.pending(),
            [Timer.event(f"w\x01k{WINDOWS_PER_FIRING - 1:03}", 9)],
            "the rest go on after the last key fired",
        )
        testing.finish()
        self.assertEqual([x.key_str() for x in w.fire(testing.take_due()[0])], [f"k{WINDOWS_PER_FIRING:03}"])
        self.assertEqual(testing.pending(), [], "the last page does not set it again")

    def test_the_timer_memo_lasts_one_call(self):
        class T(Transform):
            def process(self, record, out):
                TUMBLING.add_record(record, count)
                if record.value == b"boom":
                    raise Error("boom")

        world = export(T)()
        world.init([])
        rec = lambda key, value: input_record({"key": key, "value": value, "timestamp": 5}, 0)  # noqa: E731
        with self.assertRaises(Err):
            world.process([rec("a", "boom")])
        Timer.event("t", 9).delete()  # the host rolls a failed call back, timers too; the simulation does not
        world.process([rec("a", "ok")])
        self.assertEqual(testing.pending(), [Timer.event("t", 9)], "the next call sets it, memo or not")
        sets = testing.calls()["set_timer"]
        world.process([rec("b", "ok"), rec("c", "ok")])
        self.assertEqual(testing.calls()["set_timer"], sets + 1, "a new call sets it again, once")

    def test_a_window_stored_per_key_by_an_older_sdk_still_fires_once(self):
        w = Windows.tumbling("w", 10)
        # The layout of earlier SDKs: ("w", key, start) and a timer per key.
        old = MapState("w", int)
        old.set("k", 0, 4)
        Timer.event("w\0k", 9).set()
        testing.finish()
        self.assertEqual(advance(9, w.fire), [("k", 0, 10, 4)])
        self.assertIsNone(old.get("k", 0), "its state is removed")
        self.assertEqual(testing.state(), {})
        self.assertEqual(w.fire(Timer.event("w\0k", 9)), [], "it fires once")

    def test_sessions_grow_merge_and_close_after_the_gap(self):
        sessions = SessionWindows("s", 10)
        add = lambda ts: sessions.add("k", ts, count, lambda a, b: a + b)  # noqa: E731
        self.assertTrue(add(0))
        self.assertTrue(add(5), "extends [0, 10) to [0, 15)")
        self.assertTrue(add(22), "a new session [22, 32)")
        self.assertEqual(len(testing.pending()), 2)
        testing.finish()
        self.assertEqual(
            testing.state(),
            {b"s\x00k": b'[{"start":0,"end":15,"value":2},{"start":22,"end":32,"value":1}]'},
            "a ValueState JSON array of {start, end, value}, as serde writes the Rust struct",
        )
        self.assertTrue(add(13), "bridges [0, 15) and [22, 32): one session [0, 32)")
        self.assertEqual(len(testing.pending()), 1, "the merged sessions' timers are replaced by one")
        self.assertEqual(advance(30, sessions.fire), [])
        self.assertEqual(advance(31, sessions.fire), [("k", 0, 32, 4)])
        self.assertFalse(add(21), "its session would have closed already")
        self.assertTrue(add(45))
        self.assertEqual(advance(100, sessions.fire), [("k", 45, 55, 1)])
        self.assertEqual(testing.state(), {})

    def test_bad_windows_and_records_are_errors(self):
        self.assertRaisesRegex(Error, "the slide at most the size", Windows.hopping, "h", 5, 10)
        self.assertRaisesRegex(Error, "the size and slide must be positive", Windows.tumbling, "h", 0)
        self.assertRaisesRegex(Error, "must not be negative", Windows.tumbling("h", 5).allowed_lateness, -1)
        self.assertRaisesRegex(Error, "the gap must be positive", SessionWindows, "s", 0)
        self.assertRaisesRegex(Error, "must not be empty", Windows.tumbling, "", 5)
        r = sluice.Record._from_wit(input_record({"key": "k", "value": "v"}, 4, topic="events", partition=2))
        with self.assertRaises(Error) as e:
            TUMBLING.add_record(r, count)
        self.assertEqual(str(e.exception), "record events-2@4 has no timestamp, so it falls in no event-time window")

    def test_timestamps_saturate_as_in_rust(self):
        edge = Windows.tumbling("e", 10).allowed_lateness(sluice.I64_MAX)
        self.assertEqual(edge.add("k", sluice.I64_MAX - 3, count), 1)
        self.assertEqual(testing.pending(), [Timer.event(b"e", sluice.I64_MAX)])


class TimeTests(unittest.TestCase):
    def setUp(self):
        reset()

    def test_watermark_and_clock_cost_one_host_call_per_call(self):
        class Late(Transform):
            def process(self, record, out):
                out.emit(record.key, "late" if record.is_late() else "on time")
                sluice.processing_time()
                sluice.processing_time()

        world = export(Late)()
        world.init([])
        recs = lambda: [  # noqa: E731
            input_record({"key": k, "value": "", "timestamp": ts}, i)
            for i, (k, ts) in enumerate([("a", 5), ("b", 10), ("c", None), ("d", 11)])
        ]
        self.assertEqual([r.value for r in world.process(recs())], [b"on time"] * 4, "no watermark yet")
        testing.set_watermark(10)
        self.assertEqual([r.value for r in world.process(recs())], [b"late", b"late", b"on time", b"on time"])
        self.assertEqual((testing.calls()["watermark"], testing.calls()["processing_time"]), (2, 2))
        # Each export call asks again: the host may have moved time in between.
        sluice._time.watermark_at = 100
        self.assertEqual([r.value for r in world.process(recs())], [b"late", b"late", b"on time", b"late"])

    def test_timers_order_compare_and_fire_when_due(self):
        Timer.processing("p", 5).set()
        Timer.event("b", 5).set()
        Timer.event("a", 5).set()
        Timer.event("a", 5).set()  # set already: nothing changes
        Timer.event("z", 1).set()
        Timer.event("gone", 2).set()
        Timer.event("gone", 2).delete()
        Timer.event("never", 3).delete()
        self.assertEqual(
            testing.pending(),
            [Timer.event("z", 1), Timer.event("a", 5), Timer.event("b", 5), Timer.processing("p", 5)],
        )
        self.assertEqual(testing.take_due(), [], "no watermark, clock at 0")
        testing.set_watermark(5)
        self.assertEqual(testing.take_due(), [Timer.event("z", 1), Timer.event("a", 5), Timer.event("b", 5)])
        testing.set_processing_time(5)
        self.assertEqual(testing.take_due(), [Timer.processing(b"p", 5)])
        self.assertNotEqual(Timer.event("p", 5), Timer.processing("p", 5))
        self.assertEqual(Timer.event("k", 1).key_str(), "k")
        self.assertRaisesRegex(Error, "out of the s64 range", Timer.event, "k", 1 << 63)
        self.assertRaisesRegex(Error, "must be an integer", Timer.event, "k", 1.5)

    def test_on_timers_runs_expiry_first_then_on_timer_and_writes_state_once(self):
        seen = ValueState("seen", ttl_ms=100)
        fired = ValueState("fired")

        class T(Transform):
            def process(self, record, out):
                seen.set(record.key, 1)
                Timer.event(record.key, 50).set()

            def on_timer(self, timer, out):
                if timer.key.startswith(b"boom"):
                    raise ValueError("no")
                fired.update(timer.key, count)
                out.emit(timer.key, f"{timer.clock.name} {timer.at}")

        world = export(T)()
        with self.assertRaises(Err) as e:
            world.on_timers([])
        self.assertEqual(e.exception.value, "on-timers called before init")
        world.init([])
        world.process([input_record({"key": "a", "value": ""}, 0)])
        self.assertEqual(testing.state(), {b"seen\x00a": b"[100,1]"})
        testing.set_watermark(60)
        testing.set_processing_time(100)
        due = testing.take_due()
        self.assertEqual(due, [Timer.event("a", 50), Timer.processing(b"\x00ttl\x00seen\x00a", 100)])
        writes = backend().calls["write"]
        out = world.on_timers([wit_timer(t) for t in due])
        self.assertEqual([(r.key, r.value) for r in out], [(b"a", b"EVENT 50")], "the TTL timer never reaches on_timer")
        self.assertEqual(testing.state(), {b"fired\x00a": b"1"}, "expired entry removed, on_timer's write kept")
        self.assertEqual(backend().calls["write"], writes + 1, "one state.write for the whole call")
        with self.assertRaises(Err) as e:
            world.on_timers([wit_timer(Timer.event("a", 70)), wit_timer(Timer.event("boom\0\n", 70))])
        self.assertEqual(e.exception.value, 'timer Event "boom\\0\\n"@70: ValueError: no')
        with self.assertRaises(Err) as e:
            world.on_timers([Timer.event("boom", 1)])
        self.assertEqual(e.exception.value, 'timer Event "boom"@1: ValueError: no')
        self.assertEqual(testing.state(), {b"fired\x00a": b"1"}, "a failed call writes nothing")

    def test_migrate_converts_the_old_state_and_writes_it_back_once(self):
        old, new = ValueState("seen"), ValueState("total")

        class Upgraded(Transform):
            def process(self, record, out):
                out.emit(record.key, str(new.get(record.key, 0)))

            def migrate(self, from_module):
                if from_module != "old":
                    raise Error(f"cannot migrate from {from_module}")
                seen = old.get("a", 0)
                old.clear("a")
                new.set("a", seen * 10)

        world = export(Upgraded)()
        with self.assertRaises(Err) as e:
            world.migrate("old")
        self.assertEqual(e.exception.value, "migrate called before init")
        backend().map[b"seen\x00a"] = b"2"
        world.init([])
        with self.assertRaises(Err) as e:
            world.migrate("other")
        self.assertEqual(e.exception.value, "cannot migrate from other")
        self.assertEqual(backend().calls["write"], 0, "a failed migration writes nothing")
        world.migrate("old")
        self.assertEqual(backend().calls["write"], 1, "one write for the whole migration")
        self.assertEqual(testing.state(), {b"total\x00a": b"20"})
        out = world.process([input_record({"key": "a", "value": "x"}, 0)])
        self.assertEqual(out[0].value, b"20")
        self.assertTrue(hasattr(world, "on_timers") and Transform(None).on_timer(None, None) is None)


SEEN = ValueState("seen").with_ttl(100)
CART = MapState("cart", ttl_ms=100)


def expire_due(now):
    """Moves the clock to ``now`` and fires the due timers as the SDK does:
    returns those that are not expiry timers."""
    testing.set_processing_time(now)
    others = [t for t in testing.take_due() if not sluice._expire(t)]
    testing.finish()
    return others


class TtlTests(unittest.TestCase):
    def setUp(self):
        reset()

    def test_an_expired_value_is_never_returned_and_then_removed(self):
        testing.set_processing_time(1_000)
        SEEN.set("a", 1)
        self.assertEqual(SEEN.get("a"), 1)
        testing.finish()
        self.assertEqual(testing.state()[b"seen\x00a"], b"[1100,1]", "stored with its expiry")
        self.assertEqual(
            testing.pending(), [Timer.processing(b"\x00ttl\x00seen\x00a", 1100)], "expiry timer: 0 ttl 0 + state key"
        )

        self.assertEqual(expire_due(1_099), [], "not yet")
        self.assertEqual(SEEN.get("a"), 1)
        testing.set_processing_time(1_100)
        self.assertIsNone(SEEN.get("a"), "expired: not returned, even before its timer fired")
        self.assertEqual(SEEN.get("a", "gone"), "gone")
        self.assertEqual(SEEN.update("a", lambda n: (n or 0) + 10), 10, "an update starts afresh")
        testing.finish()
        self.assertEqual(expire_due(1_100), [], "the first timer finds a newer expiry and keeps the entry")
        self.assertEqual(testing.state()[b"seen\x00a"], b"[1200,10]")
        self.assertEqual(expire_due(1_200), [])
        self.assertNotIn(b"seen\x00a", testing.state(), "removed from the store")
        self.assertEqual(testing.pending(), [])

    def test_expired_map_entries_are_left_out_of_reads_and_scans(self):
        testing.set_processing_time(0)
        CART.set("u", "apple", 1)
        testing.finish()
        testing.set_processing_time(50)
        CART.set("u", "pear", 2)
        testing.finish()
        self.assertEqual(testing.state()[b"cart\x00\x00\x00\x00\x01upear"], b"[150,2]")
        testing.set_processing_time(120)
        self.assertIsNone(CART.get("u", "apple"))
        self.assertEqual(CART.entries("u"), [("pear", 2)])
        self.assertEqual(CART.keys("u"), ["pear"])
        self.assertEqual(expire_due(150), [])
        self.assertEqual(CART.entries("u"), [])
        self.assertEqual(testing.state(), {})

    def test_other_timers_are_not_expiry_timers(self):
        self.assertFalse(sluice._expire(Timer.processing("seen\0a", 5)))
        self.assertFalse(sluice._expire(Timer.event(b"\x00ttl\x00seen\x00a", 5)))
        self.assertTrue(sluice._expire(Timer.processing(b"\x00ttl\x00seen\x00a", 5)), "an expiry timer, nothing to do")

    def test_values_written_by_rust_read_the_same(self):
        backend().map[b"seen\x00b"] = b"[ 500 , {\"x\": [1]} ]"
        testing.set_processing_time(499)
        self.assertEqual(SEEN.get("b"), {"x": [1]})
        backend().map[b"seen\x00c"] = b"7"
        self.assertRaisesRegex(Error, r"state `seen`: invalid JSON: expected \[expires_at, value\]", SEEN.get, "c")
        self.assertRaisesRegex(Error, "must not be negative", ValueState, "x", -1)
        self.assertEqual(ValueState("x", ttl_ms=0).ttl_ms, 0, "0: no time-to-live")


def golden(name):
    d = ROOT / "examples" / "python" / name
    return d, (d / "testdata" / "expected.jsonl").read_text().splitlines()


class ExampleTests(unittest.TestCase):
    def test_windowed_count_matches_golden_output(self):
        d, expected = golden("windowed-count")
        self.assertEqual(run_exec(d), expected)
        self.assertEqual(run_exec(d, packed=True), expected)
        self.assertEqual(run_exec(d, timers_as_wit=False), expected)
        self.assertEqual(testing.state(), {}, "every window fired and its state is gone")
        self.assertEqual(run_exec(d, packed=True, hold=True), expected)
        self.assertEqual(testing.state(), {}, "held: every window fired and its state is gone")

    def test_windowed_count_rejects_bad_config(self):
        d, _ = golden("windowed-count")
        with self.assertRaises(Err) as e:
            run_exec(d, config=[("window", "soon")])
        self.assertTrue(e.exception.value.startswith('config key `window`: invalid duration "soon"'), e.exception.value)

    def test_dedup_matches_golden_output(self):
        d, expected = golden("dedup")
        self.assertEqual(run_exec(d), expected)
        for bs in (1, 3):
            self.assertEqual(run_exec(d, batch_size=bs), expected, f"batch size {bs}")
            self.assertEqual(run_exec(d, batch_size=bs, packed=True), expected, f"batch size {bs}, packed")
            self.assertEqual(run_exec(d, batch_size=bs, packed=True, hold=True), expected, f"batch size {bs}, held")
        # Keys: MapState ("seen", record key, value bytes); values [expires_at, true].
        self.assertEqual(
            sorted(testing.state().items()),
            [
                (b"seen\x00\x00\x00\x00\x07order-1paid", b"[120000,true]"),
                (b"seen\x00\x00\x00\x00\x07order-1shipped", b"[120000,true]"),
                (b"seen\x00\x00\x00\x00\x07order-2shipped", b"[120000,true]"),
            ],
        )

    def test_config_durations_read_as_the_job_files_notation(self):
        c = sluice.Config([("a", "1m 30s"), ("b", " 500ms "), ("c", "2h"), ("d", "10"), ("e", "1.5s"), ("f", "1x")])
        self.assertEqual((c.duration_ms("a"), c.duration_ms("b"), c.duration_ms("c")), (90_000, 500, 7_200_000))
        self.assertEqual(c.duration_ms("unset", 7), 7)
        for k in "def":
            self.assertRaisesRegex(Error, f'config key `{k}`: invalid duration "', c.duration_ms, k)


if __name__ == "__main__":
    unittest.main()
