// Event time, timers, windows and state time-to-live outside a component
// (../testing.js simulates the host's clock and timers). Mirrors the Rust
// SDK's guest-sdk/src/window/tests.rs, state/ttl.rs and time.rs (and the
// Python SDK's tests/test_time.py), byte for byte where state is concerned,
// and runs the windowed-count and dedup examples against their golden
// testdata as `sluice exec` would. Run: sdks/javascript/test/run.sh

import { test, beforeEach } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";

import * as testing from "../testing.js";
import * as host from "../testing/host.js";
import {
  Config,
  I64_MAX,
  MapState,
  Record,
  SessionWindows,
  SluiceError,
  Timer,
  Transform,
  ValueState,
  WINDOWS_PER_FIRING,
  Windows,
  __internals,
  exportTransform,
  processingTime,
} from "../sluice.js";

const dec = new TextDecoder();
const root = new URL("../../../", import.meta.url);
const b = (s) => Uint8Array.from(s, (c) => c.charCodeAt(0));
const str = (bytes) => String.fromCharCode(...bytes);
const stored = () => testing.state().map(([k, v]) => [str(k), dec.decode(v)]);
const i64Key = (n) => {
  const out = new Uint8Array(8);
  new DataView(out.buffer).setBigUint64(0, BigInt.asUintN(64, BigInt(n) + (1n << 63n)));
  return out;
};
const show = (timers) => timers.map((t) => t.toString());
const count = (n) => (n ?? 0) + 1;

beforeEach(() => {
  testing.resetState();
  testing.reset();
});

/**
 * Moves the watermark to `at` and fires what is due through `fire` (which
 * returns an array of windows, or a window or null), as the host would:
 * round after round, each a new call, while firing sets timers that are due.
 * Collects [key, start, end, value].
 */
function advance(at, fire) {
  testing.setWatermark(at);
  const closed = [];
  for (;;) {
    const due = testing.takeDue();
    if (due.length === 0) return closed;
    __internals.newCall();
    for (const timer of due) {
      for (const w of [fire(timer)].flat()) if (w !== null) closed.push([w.keyStr(), w.start, w.end, w.value]);
    }
    testing.finish();
  }
}

const TUMBLING = Windows.tumbling("t", 10);
const fireT = (t) => TUMBLING.fire(t);

test("a tumbling window fires once when the watermark passes its end", () => {
  for (const [key, ts] of [["a", 1], ["a", 9], ["b", 5], ["a", 10], ["a", -1]]) assert.equal(TUMBLING.add(key, ts, count), 1);
  assert.deepEqual(advance(-2, fireT), []);
  assert.deepEqual(advance(8, fireT), [["a", -10, 0, 1]], "a window before 0 too");
  assert.deepEqual(advance(9, fireT).sort(), [["a", 0, 10, 2], ["b", 0, 10, 1]]);
  assert.equal(TUMBLING.add("a", 3, count), 0, "its window has fired: too late");
  assert.equal(testing.pending().length, 1, "only [10, 20) is open");
  assert.deepEqual(advance(19, fireT), [["a", 10, 20, 1]]);
  assert.deepEqual(testing.pending(), []);
  assert.deepEqual(TUMBLING.fire(Timer.event("t", 9)), [], "a fired window's state is gone");
  assert.deepEqual(TUMBLING.fire(Timer.event("t\0a", 9)), [], "nor is there one stored per key");
  assert.deepEqual(TUMBLING.fire(Timer.event("other", 9)), [], "another window's timer");
  assert.deepEqual(TUMBLING.fire(Timer.event("other\0a", 9)), [], "another window's timer");
  assert.deepEqual(TUMBLING.fire(Timer.processing("t", 19)), [], "not an event-time timer");
});

test("the window state and timer layout is the Rust SDK's", () => {
  TUMBLING.add("a", 12, count);
  TUMBLING.add("a", -5, count);
  TUMBLING.add("b", 13, count);
  testing.finish();
  // MapState ("t", start as an i64 map key: big-endian, sign bit flipped; "a"
  // as the map key): one window's keys are one key range.
  assert.deepEqual(stored(), [
    ["t\x00\x00\x00\x00\x08" + str(i64Key(-10)) + "a", "1"],
    ["t\x00\x00\x00\x00\x08" + str(i64Key(10)) + "a", "1"],
    ["t\x00\x00\x00\x00\x08" + str(i64Key(10)) + "b", "1"],
  ]);
  assert.deepEqual(show(testing.pending()), show([Timer.event("t", -1), Timer.event("t", 19)]), "one timer per window end");
  const late = Windows.tumbling("l", 10).allowedLateness(5);
  late.add(new Uint8Array([0xff]), 3, () => ({ n: 1, s: "é" }));
  testing.finish();
  assert.ok(testing.pending().some((t) => t.equals(Timer.event("l", 14))), "end - 1 + lateness");
  assert.ok(
    stored().some(([k, v]) => k === "l\x00\x00\x00\x00\x08" + str(i64Key(0)) + "\xff" && v === '{"n":1,"s":"é"}'),
  );
});

test("allowed lateness keeps a window open and still fires it once", () => {
  const late = Windows.tumbling("l", 10).allowedLateness(5);
  late.add("k", 2, count);
  assert.deepEqual(advance(12, (t) => late.fire(t)), []);
  assert.equal(late.add("k", 3, count), 1, "late, within the allowed lateness");
  assert.deepEqual(advance(14, (t) => late.fire(t)), [["k", 0, 10, 2]]);
});

test("a hopping window takes each record into every window that holds it", () => {
  const hopping = Windows.hopping("h", 10, 5);
  const push = (ts) => (v) => [...(v ?? []), ts];
  assert.equal(hopping.add("k", 7, push(7)), 2, "in [0, 10) and [5, 15)");
  assert.equal(hopping.add("k", 12, push(12)), 2, "in [5, 15) and [10, 20)");
  assert.deepEqual(advance(30, (t) => hopping.fire(t)), [
    ["k", 0, 10, [7]],
    ["k", 5, 15, [7, 12]],
    ["k", 10, 20, [12]],
  ]);
});

test("one timer per window end closes every key's window in pages", () => {
  const w = Windows.tumbling("w", 10);
  const keys = Array.from({ length: WINDOWS_PER_FIRING * 2 + 5 }, (_, i) => `key-${String(i).padStart(4, "0")}`);
  for (const key of keys) {
    w.add(key, 3, count);
    w.add(key, 12, count);
  }
  testing.finish();
  assert.equal(testing.calls().setTimer, 2, "one host crossing per window end in a call");
  assert.deepEqual(
    show(testing.pending()),
    show([Timer.event("w", 9), Timer.event("w", 19)]),
    "one timer per window end, not per key",
  );
  const scans = testing.calls().scanPrefix;
  testing.setWatermark(9);
  const due = testing.takeDue();
  assert.deepEqual(show(due), show([Timer.event("w", 9)]));
  __internals.newCall();
  const first = w.fire(due[0]);
  testing.finish();
  assert.equal(first.length, WINDOWS_PER_FIRING);
  const last = keys[WINDOWS_PER_FIRING - 1];
  assert.deepEqual(
    show(testing.pending()),
    show([Timer.event(`w\x01${last}`, 9), Timer.event("w", 19)]),
    "the rest go on after the last key fired",
  );
  const closed = [...first.map((x) => [x.keyStr(), x.start, x.end, x.value]), ...advance(9, (t) => w.fire(t))];
  assert.deepEqual(closed, keys.map((k) => [k, 0, 10, 1]), "every key's window once, in key order, over three firings");
  assert.equal(testing.calls().scanPrefix - scans, 3, `pages of ${WINDOWS_PER_FIRING}`);
  assert.deepEqual(show(testing.pending()), show([Timer.event("w", 19)]));
  assert.equal(advance(19, (t) => w.fire(t)).length, keys.length);
  assert.deepEqual(testing.pending(), []);
  assert.deepEqual(testing.state(), [], "every window's state is gone");
});

test("add sets a window end's timer once per call", () => {
  const w = Windows.tumbling("w", 10);
  w.add("a", 3, count);
  w.add("b", 4, count);
  assert.equal(testing.calls().setTimer, 1);
  __internals.newCall();
  w.add("c", 5, count);
  w.add("a", 6, count);
  assert.equal(testing.calls().setTimer, 2, "a new call sets it again (a no-op on the host), for a new window entry only");
  assert.deepEqual(show(testing.pending()), show([Timer.event("w", 9)]));
});

test("a window stored per key by an older SDK still fires once", () => {
  const w = Windows.tumbling("w", 10);
  // The layout of earlier SDKs: ("w", key, start) and a timer per key.
  const old = new MapState("w", { keyType: "i64" });
  old.set("k", 0, 4);
  Timer.event("w\0k", 9).set();
  testing.finish();
  assert.deepEqual(stored(), [["w\x00\x00\x00\x00\x01k" + str(i64Key(0)), "4"]]);
  assert.deepEqual(advance(9, (t) => w.fire(t)), [["k", 0, 10, 4]]);
  assert.equal(old.get("k", 0), undefined, "its state is removed");
  assert.deepEqual(testing.state(), []);
  assert.deepEqual(w.fire(Timer.event("w\0k", 9)), [], "and it fires once");
});

test("sessions grow, merge and close after the gap", () => {
  const sessions = new SessionWindows("s", 10);
  const add = (ts) => sessions.add("k", ts, count, (x, y) => x + y);
  const fire = (t) => sessions.fire(t);
  assert.ok(add(0));
  assert.ok(add(5), "extends [0, 10) to [0, 15)");
  assert.ok(add(22), "a new session [22, 32)");
  assert.equal(testing.pending().length, 2);
  testing.finish();
  assert.deepEqual(
    stored(),
    [["s\x00k", '[{"start":0,"end":15,"value":2},{"start":22,"end":32,"value":1}]']],
    "a ValueState JSON array of {start, end, value}, as serde writes the Rust struct",
  );
  assert.ok(add(13), "bridges [0, 15) and [22, 32): one session [0, 32)");
  assert.equal(testing.pending().length, 1, "the merged sessions' timers are replaced by one");
  assert.deepEqual(advance(30, fire), []);
  assert.deepEqual(advance(31, fire), [["k", 0, 32, 4]]);
  assert.ok(!add(21), "its session would have closed already");
  assert.ok(add(45));
  assert.deepEqual(advance(100, fire), [["k", 45, 55, 1]]);
  assert.deepEqual(testing.state(), []);
});

test("bad windows and records are errors", () => {
  assert.throws(() => Windows.hopping("h", 5, 10), /the slide at most the size/);
  assert.throws(() => Windows.tumbling("h", 0), /the size and slide must be positive/);
  assert.throws(() => Windows.tumbling("h", 5).allowedLateness(-1), /must not be negative/);
  assert.throws(() => Windows.tumbling("h", 1.5), /whole number of milliseconds/);
  assert.throws(() => new SessionWindows("s", 0), /the gap must be positive/);
  assert.throws(() => Windows.tumbling("", 5), /must not be empty/);
  const r = new Record({ ...testing.inputRecord({ key: "k", value: "v" }, 4), topic: "events", partition: 2 });
  assert.throws(
    () => TUMBLING.addRecord(r, count),
    (e) => e.message === "record events-2@4 has no timestamp, so it falls in no event-time window",
  );
  assert.throws(() => TUMBLING.add("k", 1.5, count), /must be an integer/);
});

test("window bounds saturate at the s64 bounds as in Rust, exactly", () => {
  const edge = Windows.tumbling("e", 10).allowedLateness(I64_MAX);
  assert.equal(edge.add("k", I64_MAX - 3n, count), 1);
  const [t] = testing.pending();
  assert.equal(t.atBigInt, I64_MAX, "the exact s64, not 2^63 as a number");
  assert.ok(t.equals(Timer.event("e", 2 ** 63)), "a number at 2^63 stands for the bound");
  assert.deepEqual(edge.fire(t), [], "fire recomputes the start from at - lateness, saturated: as in Rust, not this window");
  // A realistic one: the window's start arithmetic in BigInt, numbers out.
  const day = Windows.tumbling("d", 86_400_000);
  day.add("k", 1_700_000_000_123, count);
  testing.setWatermark(1_700_006_400_000);
  const [[fired]] = testing.takeDue().map((x) => day.fire(x));
  assert.deepEqual([fired.start, fired.end, fired.value], [1_699_920_000_000, 1_700_006_400_000, 1]);
  assert.equal(fired.startBigInt, 1_699_920_000_000n);
});

test("watermark and clock cost one host call per call; isLate", () => {
  const t = exportTransform(
    class extends Transform {
      process(record, out) {
        out.emit(record.key, record.isLate() ? "late" : "on time");
        processingTime();
        processingTime();
      }
    },
  );
  t.init([]);
  const recs = () =>
    [["a", 5], ["b", 10], ["c", undefined], ["d", 11]].map(([k, ts], i) =>
      testing.inputRecord({ key: k, value: "", timestamp: ts }, i),
    );
  const values = (out) => out.map((r) => dec.decode(r.value));
  assert.deepEqual(values(t.process(recs())), ["on time", "on time", "on time", "on time"], "no watermark yet");
  testing.setWatermark(10);
  assert.deepEqual(values(t.process(recs())), ["late", "late", "on time", "on time"]);
  assert.deepEqual([testing.calls().watermark, testing.calls().processingTime], [2, 2]);
  // Each export call asks again: the host may have moved time in between.
  host.time.watermark = 100n;
  assert.deepEqual(values(t.process(recs())), ["late", "late", "on time", "late"]);
});

test("timers order, compare and fire when due", () => {
  Timer.processing("p", 5).set();
  Timer.event("b", 5).set();
  Timer.event("a", 5).set();
  Timer.event("a", 5).set(); // set already: nothing changes
  Timer.event("z", 1).set();
  Timer.event("gone", 2).set();
  Timer.event("gone", 2).delete();
  Timer.event("never", 3).delete();
  assert.deepEqual(show(testing.pending()), show([Timer.event("z", 1), Timer.event("a", 5), Timer.event("b", 5), Timer.processing("p", 5)]));
  assert.deepEqual(testing.takeDue(), [], "no watermark, clock at 0");
  testing.setWatermark(5);
  assert.deepEqual(show(testing.takeDue()), show([Timer.event("z", 1), Timer.event("a", 5), Timer.event("b", 5)]));
  testing.setProcessingTime(5);
  const [p] = testing.takeDue();
  assert.ok(p.equals(Timer.processing("p", 5)) && p.at === 5 && p.atBigInt === 5n);
  assert.ok(!Timer.event("p", 5).equals(Timer.processing("p", 5)));
  assert.equal(Timer.event("k", 1).keyStr(), "k");
  assert.deepEqual(Timer.event("k", 1).toWit(), { clock: "event", key: b("k"), at: 1n }, "s64 crosses as a BigInt");
  assert.throws(() => Timer.event("k", 1n << 63n), /out of the s64 range/);
  assert.throws(() => Timer.event("k", 1.5), /must be an integer/);
  assert.throws(() => new Timer("wall", "k", 1), /"event" or "processing"/);
});

test("onTimers runs expiry first, then onTimer, and writes state once", () => {
  const seen = new ValueState("seen", { ttlMs: 100 });
  const fired = new ValueState("fired");
  const t = exportTransform(
    class extends Transform {
      process(record) {
        seen.set(record.key, 1);
        Timer.event(record.key, 50).set();
      }
      onTimer(timer, out) {
        if (dec.decode(timer.key).startsWith("boom")) throw new TypeError("no");
        fired.update(timer.key, count);
        out.emit(timer.key, `${timer.clock} ${timer.at}`);
      }
    },
  );
  assert.throws(() => t.onTimers([]), (e) => e === "on-timers called before init");
  t.init([]);
  t.process([testing.inputRecord({ key: "a", value: "" }, 0)]);
  assert.deepEqual(stored(), [["seen\x00a", "[100,1]"]]);
  testing.setWatermark(60);
  testing.setProcessingTime(100);
  const due = testing.takeDue();
  assert.deepEqual(show(due), show([Timer.event("a", 50), Timer.processing(b("\x00ttl\x00seen\x00a"), 100)]));
  const writes = testing.calls().write;
  const out = t.onTimers(due.map((x) => x.toWit()));
  assert.deepEqual(out.map((r) => [dec.decode(r.key), dec.decode(r.value)]), [["a", "event 50"]], "the TTL timer never reaches onTimer");
  assert.deepEqual(stored(), [["fired\x00a", "1"]], "expired entry removed, onTimer's write kept");
  assert.equal(testing.calls().write, writes + 1, "one state.write for the whole call");
  assert.throws(
    () => t.onTimers([Timer.event("a", 70).toWit(), Timer.event("boom\0\n", 70).toWit()]),
    (e) => e === 'timer Event "boom\\0\\n"@70: TypeError: no',
  );
  assert.throws(() => t.onTimers([Timer.event("boom", 1)]), (e) => e === 'timer Event "boom"@1: TypeError: no');
  assert.deepEqual(stored(), [["fired\x00a", "1"]], "a failed call writes nothing");
});

test("migrate converts the old state and writes it back once", () => {
  const old = new ValueState("seen");
  const next = new ValueState("total");
  const t = exportTransform(
    class extends Transform {
      process(record, out) {
        out.emit(record.key, String(next.get(record.key) ?? 0));
      }
      migrate(fromModule) {
        if (fromModule !== "old") throw new SluiceError(`cannot migrate from ${fromModule}`);
        const seen = old.get("a") ?? 0;
        old.clear("a");
        next.set("a", seen * 10);
      }
    },
  );
  assert.throws(() => t.migrate("old"), (e) => e === "migrate called before init");
  host.write([[b("seen\x00a"), b("2")]]);
  host.calls.write = 0;
  t.init([]);
  assert.throws(() => t.migrate("other"), (e) => e === "cannot migrate from other");
  assert.equal(testing.calls().write, 0, "a failed migration writes nothing");
  t.migrate("old");
  assert.equal(testing.calls().write, 1, "one write for the whole migration");
  assert.deepEqual(stored(), [["total\x00a", "20"]]);
  const out = t.process([testing.inputRecord({ key: "a", value: "x" }, 0)]);
  assert.equal(dec.decode(out[0].value), "20");
  assert.equal(new Transform(new Config()).onTimer(null, null), undefined, "onTimer: a no-op by default");
  assert.equal(new Transform(new Config()).migrate("x"), undefined, "migrate: a no-op by default");
});

const SEEN = new ValueState("seen").withTtl(100);
const CART = new MapState("cart", { ttlMs: 100 });

/** Moves the clock to `now` and fires the due timers as the SDK does: returns those that are not expiry timers. */
function expireDue(now) {
  testing.setProcessingTime(now);
  const others = testing.takeDue().filter((t) => !testing.expire(t));
  testing.finish();
  return others;
}

test("an expired value is never returned, and then removed", () => {
  testing.setProcessingTime(1_000);
  SEEN.set("a", 1);
  assert.equal(SEEN.get("a"), 1);
  testing.finish();
  assert.deepEqual(stored(), [["seen\x00a", "[1100,1]"]], "stored with its expiry");
  assert.deepEqual(show(testing.pending()), show([Timer.processing(b("\x00ttl\x00seen\x00a"), 1100)]), "expiry timer: 0 ttl 0 + state key");
  assert.deepEqual(expireDue(1_099), [], "not yet");
  assert.equal(SEEN.get("a"), 1);
  testing.setProcessingTime(1_100);
  assert.equal(SEEN.get("a"), undefined, "expired: not returned, even before its timer fired");
  assert.equal(SEEN.update("a", (n) => (n ?? 0) + 10), 10, "an update starts afresh");
  testing.finish();
  assert.deepEqual(expireDue(1_100), [], "the first timer finds a newer expiry and keeps the entry");
  assert.deepEqual(stored(), [["seen\x00a", "[1200,10]"]]);
  assert.deepEqual(expireDue(1_200), []);
  assert.deepEqual(stored(), [], "removed from the store");
  assert.deepEqual(testing.pending(), []);
});

test("expired map entries are left out of reads and scans", () => {
  testing.setProcessingTime(0);
  CART.set("u", "apple", 1);
  testing.finish();
  testing.setProcessingTime(50);
  CART.set("u", "pear", 2);
  testing.finish();
  assert.ok(stored().some(([k, v]) => k === "cart\x00\x00\x00\x00\x01upear" && v === "[150,2]"));
  testing.setProcessingTime(120);
  assert.equal(CART.get("u", "apple"), undefined);
  assert.deepEqual(CART.entries("u"), [["pear", 2]]);
  assert.deepEqual(CART.keys("u"), ["pear"]);
  assert.deepEqual(expireDue(150), []);
  assert.deepEqual(CART.entries("u"), []);
  assert.deepEqual(testing.state(), []);
});

test("other timers are not expiry timers", () => {
  assert.equal(testing.expire(Timer.processing("seen\0a", 5)), false);
  assert.equal(testing.expire(Timer.event(b("\x00ttl\x00seen\x00a"), 5)), false);
  assert.equal(testing.expire(Timer.processing(b("\x00ttl\x00seen\x00a"), 5)), true, "an expiry timer, nothing to do");
});

test("TTL values written by Rust read the same; expiry times stay exact", () => {
  host.write([[b("seen\x00b"), b('[ 500 , {"x": [1]} ]')]]);
  testing.setProcessingTime(499);
  assert.deepEqual(SEEN.get("b"), { x: [1] });
  host.write([[b("seen\x00c"), b("7")]]);
  assert.throws(() => SEEN.get("c"), /state `seen`: invalid JSON: expected \[expires_at, value\]/);
  assert.throws(() => new ValueState("x", { ttlMs: -1 }), /must not be negative/);
  assert.equal(new ValueState("x", { ttlMs: 0 }).ttlMs, 0, "0: no time-to-live");
  // Beyond 2^53 the expiry is written and compared exactly.
  testing.setProcessingTime(9_007_199_254_740_993n);
  SEEN.set("d", true);
  testing.finish();
  assert.ok(stored().some(([k, v]) => k === "seen\x00d" && v === "[9007199254741093,true]"));
  testing.setProcessingTime(9_007_199_254_741_092n);
  assert.equal(SEEN.get("d"), true, "one ms before its expiry");
  testing.setProcessingTime(I64_MAX);
  SEEN.set("e", 1);
  testing.finish();
  assert.ok(stored().some(([k, v]) => k === "seen\x00e" && v === `[${I64_MAX},1]`), "saturated");
});

test("config durations read as the job files' notation", () => {
  const c = new Config([["a", "1m 30s"], ["b", " 500ms "], ["c", "2h"], ["d", "10"], ["e", "1.5s"], ["f", "1x"]]);
  assert.deepEqual([c.durationMs("a"), c.durationMs("b"), c.durationMs("c")], [90_000, 500, 7_200_000]);
  assert.equal(c.durationMs("unset", 7), 7);
  assert.equal(c.durationMs("unset"), undefined);
  for (const k of "def") assert.throws(() => c.durationMs(k), new RegExp(`^SluiceError: config key \`${k}\`: invalid duration "`));
});

// -- the examples, as `sluice exec` runs them

function golden(name) {
  const dir = new URL(`examples/javascript/${name}/`, root);
  const read = (f) => readFileSync(new URL(`testdata/${f}`, dir), "utf8");
  const words = read("args").split(/\s+/).filter(Boolean);
  const options = { config: [] };
  for (let i = 0; i < words.length; i += 2) {
    if (words[i] === "--batch-size") options.batchSize = Number(words[i + 1]);
    else if (words[i] === "--config") options.config.push(words[i + 1].split(/=(.*)/s).slice(0, 2));
    else throw new Error(`unknown sluice exec argument ${words[i]}`);
  }
  return { dir, input: read("input.jsonl"), expected: read("expected.jsonl").trimEnd().split("\n"), options };
}

test("windowed-count matches its golden output", async () => {
  const { dir, input, expected, options } = golden("windowed-count");
  const app = await import(new URL("app.js", dir).href);
  assert.deepEqual(testing.exec(app, input, options), expected);
  assert.deepEqual(testing.exec(app, input, { ...options, batchSize: 1 }), expected);
  assert.deepEqual(testing.state(), [], "every window fired and its state is gone");
  assert.throws(
    () => testing.exec(app, input, { config: [["window", "soon"]] }),
    (e) => e.startsWith('config key `window`: invalid duration "soon"'),
  );
});

test("dedup matches its golden output", async () => {
  const { dir, input, expected, options } = golden("dedup");
  const app = await import(new URL("app.js", dir).href);
  for (const batchSize of [undefined, 1, 3]) {
    assert.deepEqual(testing.exec(app, input, { ...options, batchSize }), expected, `batch size ${batchSize}`);
  }
  // Keys: MapState ("seen", record key, value bytes); values [expires_at, true].
  assert.deepEqual(stored(), [
    ["seen\x00\x00\x00\x00\x07order-1paid", "[120000,true]"],
    ["seen\x00\x00\x00\x00\x07order-1shipped", "[120000,true]"],
    ["seen\x00\x00\x00\x00\x07order-2shipped", "[120000,true]"],
  ]);
});
