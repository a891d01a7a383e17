// Tests of the JavaScript SDK outside a component, against the in-memory host
// of ../testing/host.js (see ../testing/hooks.js). Run: sdks/javascript/test/run.sh
//
// - the running-count example against its golden testdata, at several batch
//   sizes, and the number of host calls per batch;
// - the state key and value layout shared with the Rust SDK;
// - errors become result strings with the record's position, and a failed
//   batch leaves no state behind.

import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";

import * as host from "../testing/host.js";
import * as testing from "../testing.js";
import {
  Config,
  ListState,
  MapState,
  SluiceError,
  Transform,
  ValueState,
  __internals,
  exportTransform,
  packedExports,
} from "../sluice.js";

const enc = new TextEncoder();
const dec = new TextDecoder();
const root = new URL("../../../", import.meta.url);

// One WIT input-record from a testdata line, as `sluice exec` builds it.
function inputRecord(line, offset) {
  const j = JSON.parse(line);
  const bytes = (v) => (v == null ? undefined : enc.encode(v));
  return {
    key: bytes(j.key),
    value: bytes(j.value),
    headers: [],
    timestamp: undefined,
    topic: "input",
    partition: 0,
    offset: BigInt(offset),
  };
}

function outputLine(r) {
  const text = (v) => (v === undefined ? undefined : dec.decode(v));
  return JSON.stringify({ key: text(r.key), value: r.value === undefined ? null : text(r.value) });
}

// A `packed-batch` (wit/sluice.wit) of WIT input-records of one partition,
// as the host packs it (host/src/runtime/packed.rs).
function packBatch(records) {
  const bytes = [];
  const u32 = (n) => bytes.push(n & 0xff, (n >>> 8) & 0xff, (n >>> 16) & 0xff, n >>> 24);
  const i64 = (n) => {
    for (let i = 0n; i < 8n; i++) bytes.push(Number((BigInt.asUintN(64, BigInt(n)) >> (8n * i)) & 0xffn));
  };
  const sized = (b) => (u32(b.length), bytes.push(...b));
  const topics = [...new Set(records.map((r) => r.topic))];
  u32(records[0]?.partition ?? 0);
  u32(topics.length);
  topics.forEach((t) => sized(enc.encode(t)));
  u32(records.length);
  for (const r of records) {
    bytes.push((r.key !== undefined ? 1 : 0) | (r.value !== undefined ? 2 : 0) | (r.timestamp !== undefined ? 4 : 0));
    u32(topics.indexOf(r.topic));
    i64(r.offset);
    if (r.timestamp !== undefined) i64(r.timestamp);
    if (r.key !== undefined) sized(r.key);
    if (r.value !== undefined) sized(r.value);
    u32(r.headers.length);
    for (const h of r.headers) sized(enc.encode(h.key)), sized(h.value);
  }
  return Uint8Array.from(bytes);
}

// The records of a `packed-outputs` string, as output-record shapes.
function unpackOutputs(packed) {
  const view = new DataView(packed.buffer, packed.byteOffset, packed.byteLength);
  let at = 0;
  const u32 = () => ((at += 4), view.getUint32(at - 4, true));
  const sized = () => {
    const n = u32();
    assert.ok(at + n <= packed.length, `cut short at byte ${at}`);
    return packed.slice(at, (at += n));
  };
  const out = [];
  for (let i = u32(); i > 0; i--) {
    const flags = packed[at++];
    assert.ok(flags < 8, `unknown flags ${flags}`);
    const topic = flags & 4 ? dec.decode(sized()) : undefined;
    const key = flags & 1 ? sized() : undefined;
    const value = flags & 2 ? sized() : undefined;
    const headers = [];
    for (let h = u32(); h > 0; h--) headers.push({ key: dec.decode(sized()), value: sized() });
    out.push({ key, value, headers, topic });
  }
  assert.equal(at, packed.length, "bytes after the last record");
  return out;
}

// One batch through `app`'s exports: as a list of records, or packed both
// ways (`process-packed-out`, what a host of 0.1.5 calls).
function process(app, batch, packed) {
  return packed ? unpackOutputs(packedExports(app.process).processPackedOut(packBatch(batch))) : app.process(batch);
}

async function runExample(dir, batchSize, packed = false) {
  testing.resetState();
  const app = await import(new URL(`${dir}/app.js?bs=${batchSize}`, root).href);
  const lines = readFileSync(new URL(`${dir}/testdata/input.jsonl`, root), "utf8").trim().split("\n");
  app.init([]);
  const out = [];
  let batches = 0;
  for (let i = 0; i < lines.length; i += batchSize) {
    const batch = lines.slice(i, i + batchSize).map((l, j) => inputRecord(l, i + j));
    out.push(...process(app, batch, packed).map(outputLine));
    batches++;
  }
  return { out, batches };
}

test("running-count matches its golden output at every batch size", async () => {
  const expected = readFileSync(new URL("examples/javascript/running-count/testdata/expected.jsonl", root), "utf8")
    .trim()
    .split("\n");
  for (const [bs, packed] of [1, 3, 100].flatMap((bs) => [[bs, false], [bs, true]])) {
    const { out, batches } = await runExample("examples/javascript/running-count", bs, packed);
    assert.deepEqual(out, expected, `batch size ${bs}, packed ${packed}`);
    // Two host calls per batch, however many records: get-many, write.
    assert.deepEqual([host.calls.get, host.calls.getMany, host.calls.write], [0, batches, batches]);
  }
});

test("state layout is the Rust SDK's: name 0x00 key, JSON value", async () => {
  await runExample("examples/javascript/running-count", 3);
  const entries = [...host.map.values()].map(([k, v]) => [dec.decode(k), dec.decode(v)]).sort();
  assert.deepEqual(entries, [
    ["count\0", "2"],
    ["count\0alice", "3"],
    ["count\0bob", "2"],
  ]);
  const s = new ValueState("count");
  assert.deepEqual(s.key("user-1"), enc.encode("count\0user-1"));
  assert.deepEqual(s.key(new Uint8Array([0xff])), new Uint8Array([...enc.encode("count\0"), 0xff]));
  assert.throws(() => new ValueState(""), /must not be empty/);
  assert.throws(() => new ValueState("a\0b"), /0x00/);
});

const SEEN = new ValueState("seen");

class Failing extends Transform {
  constructor(config) {
    super(config);
    this.failOn = config.get("fail_on");
  }
  beginBatch(batch) {
    SEEN.prefetch(batch.keys());
  }
  process(record, out) {
    const n = SEEN.update(record.keyOrEmpty(), (n) => (n ?? 0) + 1);
    if (record.valueStr() === this.failOn) throw new SluiceError("asked to fail");
    if (record.valueStr() === "type") null.x;
    out.emitJson(record.key, { n, s: "é\n" }, { headers: [["h", "1"]], topic: "t" });
  }
}

test("errors fail the batch with the record's position and no state", () => {
  testing.resetState();
  const t = exportTransform(Failing);
  const rec = (k, v, offset) => ({ ...inputRecord(JSON.stringify({ key: k, value: v }), offset), topic: "events", partition: 3 });
  assert.throws(() => t.process([]), (e) => e === "process called before init");
  t.init([["fail_on", "boom"]]);
  let out = t.process([rec("a", "x", 1), rec(null, "y", 2)]);
  assert.equal(dec.decode(out[0].value), '{"n":1,"s":"é\\n"}');
  assert.equal(out[0].topic, "t");
  assert.deepEqual([out[0].headers[0].key, dec.decode(out[0].headers[0].value)], ["h", "1"]);
  assert.equal(out[1].key, undefined);
  assert.throws(() => t.process([rec("a", "x", 40), rec("a", "boom", 41)]), (e) => e === "record events-3@41: asked to fail");
  assert.throws(() => t.process([rec("a", "type", 7)]), (e) => e.startsWith("record events-3@7: TypeError: "));
  assert.equal(host.calls.write, 1, "failed batches write nothing");
  out = t.process([rec("a", "x", 42)]);
  assert.equal(dec.decode(out[0].value), '{"n":2,"s":"é\\n"}', "the replay sees the last good batch's state");
});

test("packed batches and outputs carry what records do", () => {
  testing.resetState();
  const t = exportTransform(
    class extends Transform {
      process(record, out) {
        out.forward(record);
        out.emit(undefined, undefined, { headers: [["seen", record.keyOrEmpty()], ["offset", String(record.offset)]], topic: "audit" });
      }
    },
  );
  t.init([]);
  const batch = [
    { ...inputRecord('{"key": "k", "value": "v"}', 0), timestamp: 5n, headers: [{ key: "h", value: new Uint8Array([0, 255]) }, { key: "", value: new Uint8Array() }] },
    inputRecord('{"value": "no key"}', 1),
    inputRecord('{"key": "tomb", "value": null}', 2),
    { ...inputRecord('{"key": "ü", "value": ""}', -3), topic: "other", timestamp: -1n },
  ];
  const shaped = (outputs) =>
    outputs.map((r) => [r.key && [...r.key], r.value && [...r.value], r.headers.map((h) => [h.key, [...h.value]]), r.topic]);
  const expected = shaped(t.process(batch));
  assert.equal(expected.length, 8);
  assert.deepEqual(expected[0], [[...enc.encode("k")], [...enc.encode("v")], [["h", [0, 255]], ["", []]], undefined]);
  assert.deepEqual(expected[1], [undefined, undefined, [["seen", [...enc.encode("k")]], ["offset", [...enc.encode("0")]]], "audit"]);
  const packed = packedExports(t.process);
  assert.deepEqual(shaped(unpackOutputs(packed.processPackedOut(packBatch(batch)))), expected);
  assert.deepEqual(shaped(packed.processPacked(packBatch(batch))), expected);
  assert.deepEqual(unpackOutputs(packed.processPackedOut(packBatch([]))), []);
  // What the records saw came through unchanged: timestamps and offsets too.
  const seen = [];
  const probe = packedExports((records) => (seen.push(...records.map((r) => [r.timestamp, r.offset, r.topic])), []));
  probe.processPackedOut(packBatch(batch));
  assert.deepEqual(seen, [[5n, 0n, "input"], [undefined, 1n, "input"], [undefined, 2n, "input"], [-1n, -3n, "other"]]);
});

test("a malformed packed batch fails the batch", () => {
  testing.resetState();
  const t = exportTransform(
    class extends Transform {
      process() {}
    },
  );
  t.init([]);
  const packed = packedExports(t.process);
  const good = packBatch([inputRecord('{"key": "k", "value": "v"}', 0)]);
  const cases = [
    [good.slice(0, -1), ""],
    [Uint8Array.from([...good, 0]), "1 bytes after the last entry"],
    [good.slice(0, 6), ""],
  ];
  for (const [bad, why] of cases) {
    assert.throws(
      () => packed.processPackedOut(bad),
      (e) => typeof e === "string" && e.startsWith("host bug: malformed packed batch") && e.includes(why),
    );
  }
});

test("values read and rewritten unchanged are not written back; clear deletes", () => {
  testing.resetState();
  const t = exportTransform(
    class extends Transform {
      process(record) {
        if (record.valueStr() === "clear") SEEN.clear(record.key);
        else if (record.valueStr() === "init") SEEN.set(record.key, 5);
        else if (SEEN.get(record.key) !== 5) throw new SluiceError("expected 5");
        else SEEN.set(record.key, 5);
      }
    },
  );
  t.init([]);
  const rec = (v) => inputRecord(JSON.stringify({ key: "k", value: v }), 0);
  t.process([rec("init")]);
  assert.equal(host.calls.write, 1);
  t.process([rec("set")]);
  assert.equal(host.calls.write, 1, "same value as the host's: nothing to write");
  t.process([rec("clear")]);
  assert.equal(host.map.size, 0);
});

test("config helpers name the key and value", () => {
  const c = new Config([["mode", "keep"], ["n", "12"], ["bad", "x1"], ["mode", "drop"]]);
  assert.equal(c.get("mode"), "drop", "last value wins");
  assert.equal(c.parse("n", Number), 12);
  assert.equal(c.parse("absent", Number, 7), 7);
  assert.throws(() => c.parse("bad", Number), /config key `bad`: invalid value "x1"/);
  assert.throws(() => c.require("contains"), /missing required config key `contains`/);
  assert.equal(c.choice("mode", ["keep", "drop"]), "drop");
  assert.throws(() => c.choice("n", ["keep", "drop"]), /expected one of `keep`, `drop`/);
});

test("init errors become the result string", () => {
  const t = exportTransform(
    class extends Transform {
      constructor(config) {
        super(config);
        config.require("needed");
      }
    },
  );
  assert.throws(() => t.init([]), (e) => e === "missing required config key `needed`");
});

// -- held state (world `cached`): once the host calls `hold-state`, a
// shard's cache stays from one batch of the shard to the next, within the
// bytes the host allows, until its `flush-state` for the shard.

const COUNTS = new ValueState("count");
const LAST = new MapState("last");
const PUSHED = new ListState("pushed");

class Counting extends Transform {
  beginBatch(batch) {
    COUNTS.prefetch(batch.keys());
  }

  process(record, out) {
    const key = record.keyOrEmpty();
    if (dec.decode(record.value) === "fail") throw new Error("asked to fail");
    const n = COUNTS.update(key, (n) => (n ?? 0) + 1);
    LAST.set(key, "v", dec.decode(record.value));
    if (n % 3 === 0) PUSHED.push(key, n);
    // A scan: the call's writes go to the host first.
    if (n % 4 === 0) assert.deepEqual(LAST.entries(key), [["v", dec.decode(record.value)]]);
    out.emit(key, String(n));
  }
}

// Drives Counting as a host does: packed batches whose state calls reach
// only their shard's store (the simulated host's one map, swapped per
// shard); with `maxBytes`, hold-state after init and flush-state on request.
class HoldingHost {
  constructor(maxBytes) {
    testing.resetState();
    testing.reset();
    this.shards = new Map();
    this.held = new Set();
    this.writes = 0;
    this.app = exportTransform(Counting);
    this.exports = packedExports(this.app.process);
    this.app.init([]);
    this.holding = maxBytes !== undefined;
    if (this.holding) this.exports.holdState(BigInt(maxBytes));
    this.offset = 0;
  }

  scoped(shard, f) {
    host.map.clear();
    for (const [k, v] of this.shards.get(shard) ?? []) host.map.set(k, v);
    const before = host.calls.write;
    try {
      return f();
    } finally {
      this.writes += host.calls.write - before;
      this.shards.set(shard, new Map(host.map));
      host.map.clear();
    }
  }

  batch(shard, keys, value = "x") {
    const records = keys.map((k, i) => ({
      key: enc.encode(k), value: enc.encode(value), headers: [], timestamp: undefined,
      topic: "in", partition: shard, offset: this.offset + i,
    }));
    this.offset += records.length;
    if (this.holding) this.held.add(shard);
    return this.scoped(shard, () =>
      unpackOutputs(this.exports.processPackedOut(packBatch(records))).map((r) => `${dec.decode(r.key)}=${dec.decode(r.value)}`),
    );
  }

  flush(shard) {
    this.held.delete(shard);
    this.scoped(shard, () => this.exports.flushState(shard));
  }

  flushAll() {
    for (const shard of [...this.held].sort()) this.flush(shard);
  }

  /** shard -> { key (one char per byte): value text }, without empty shards */
  stores() {
    const out = {};
    for (const [shard, m] of this.shards) {
      if (m.size === 0) continue;
      out[shard] = Object.fromEntries([...m.values()].map(([k, v]) => [String.fromCharCode(...k), dec.decode(v)]));
    }
    return out;
  }
}

// Runs `script` (["batch", shard, keys, value] and ["flush", shard] steps,
// then a flush of every held shard) on a new host; the SDK's store is one per
// process, so hosts run one after another.
function play(maxBytes, script) {
  const h = new HoldingHost(maxBytes);
  const outputs = [];
  for (const [what, shard, keys, value] of script) {
    if (what === "batch") outputs.push(h.batch(shard, keys, value));
    else h.flush(shard);
  }
  h.flushAll();
  return { h, outputs };
}

const store = __internals.store;

test("a held shard reaches the host only when asked for", () => {
  const h = new HoldingHost(1 << 20);
  const batches = [["a", "b", "a"], ["a", "c"], ["b", "b"]];
  const outputs = batches.map((keys) => h.batch(0, keys));
  assert.deepEqual(h.stores(), {}, "nothing written back before flush-state");
  assert.equal(h.writes, 0);
  assert.deepEqual(outputs[2], ["b=2", "b=3"]);
  const getMany = host.calls.getMany;
  assert.equal(getMany, 2, "each key's first batch asks the host, later ones hit the cache");
  h.flush(0);
  assert.equal(h.writes, 1, "one state.write for the three batches");
  assert.equal(store.entries.size, 0, "a flushed shard is forgotten");
  const unheld = play(undefined, batches.map((keys) => ["batch", 0, keys]));
  assert.deepEqual(outputs, unheld.outputs);
  assert.deepEqual(h.stores(), unheld.h.stores());
});

test("shards are held apart and flushed alone", () => {
  const h = new HoldingHost(1 << 20);
  assert.deepEqual(h.batch(0, ["k"]), ["k=1"]);
  assert.deepEqual(h.batch(1, ["k", "k"]), ["k=1", "k=2"]);
  assert.deepEqual(h.batch(0, ["k"]), ["k=2"]);
  h.flush(1);
  assert.deepEqual(Object.keys(h.stores()), ["1"], "only shard 1 is written");
  assert.equal(h.stores()[1]["count\x00k"], "2");
  assert.deepEqual(h.batch(1, ["k"]), ["k=3"], "read back from the host");
  assert.deepEqual(h.batch(0, ["k"]), ["k=3"], "still held");
  h.flushAll();
  assert.deepEqual([h.stores()[0]["count\x00k"], h.stores()[1]["count\x00k"]], ["3", "3"]);
});

test("over its bytes a shard is written back after the batch", () => {
  const h = new HoldingHost(1);
  h.batch(0, ["a"]);
  assert.equal(h.stores()[0]["count\x00a"], "1", "written back at once");
  assert.deepEqual(h.batch(0, ["a"]), ["a=2"]);
  h.flush(0); // nothing held: a flush-state writes nothing more
  assert.equal(h.writes, 2);
});

test("a shard over what is left is written back while another stays held", () => {
  // With room for one shard's cache and not two, the second shard's batch
  // is written back at once and the first stays held.
  const h = new HoldingHost(1 << 20);
  h.batch(0, ["a"]);
  h.exports.holdState(BigInt(store.bytes + 2 * __internals.CACHE_BYTES + 64));
  assert.deepEqual(h.batch(1, ["a"]), ["a=1"]);
  assert.deepEqual(Object.keys(h.stores()), ["1"], "shard 1 at once; shard 0 still held");
  h.flush(0);
  assert.equal(h.stores()[0]["count\x00a"], "1");
});

test("a failed batch drops what every shard held", () => {
  const h = new HoldingHost(1 << 20);
  h.batch(0, ["a"]);
  h.batch(1, ["a"]);
  assert.throws(() => h.batch(1, ["a", "b"], "fail"), /asked to fail/);
  assert.deepEqual([store.entries.size, store.parked.size, store.holding], [0, 0, undefined]);
  h.flushAll();
  assert.deepEqual(h.stores(), {}, "the host rolls the epoch back; nothing held reaches it");
});

test("timers and unheld calls leave a held shard alone", () => {
  const h = new HoldingHost(1 << 20);
  h.batch(0, ["a", "a"]);
  h.scoped(0, () => assert.deepEqual(h.app.onTimers([]), []));
  h.scoped(0, () => assert.deepEqual(h.app.process([]), []));
  assert.deepEqual(h.stores(), {});
  assert.deepEqual(h.batch(0, ["a"]), ["a=3"]);
  h.flush(0);
  assert.equal(h.stores()[0]["count\x00a"], "3");
});

test("the cache counts the bytes it holds", () => {
  const h = new HoldingHost(1 << 20);
  h.batch(0, ["a", "bb", "a"], "12345");
  h.batch(1, ["a".repeat(40)], "v".repeat(300));
  h.batch(0, Array(12).fill("ccc"), ""); // values shrink and grow
  const size = (entries) => {
    let n = 0;
    for (const slot of entries.values()) n += 160 + 2 * slot.key.length + (slot.value?.length ?? 0);
    return n;
  };
  assert.equal(store.bytes, size(store.entries));
  assert.equal(store.parked.get(1).bytes, size(store.parked.get(1).entries));
  assert.equal(store.parkedBytes, store.parked.get(1).bytes);
});

test("random calls end as a store that holds nothing does", () => {
  let seed = 7;
  // The high bits of an LCG (its low bits cycle).
  const rand = (n) => {
    seed = (seed * 1103515245 + 12345) % 2 ** 31;
    return Math.floor((seed / 2 ** 31) * n);
  };
  for (let round = 0; round < 25; round++) {
    const budget = [1, 2_000, 20_000, 1 << 30][rand(4)];
    const script = [];
    for (let step = 0; step < 60; step++) {
      const shard = rand(3);
      if (rand(100) < 15) {
        script.push(["flush", shard]);
        continue;
      }
      const keys = Array.from({ length: 1 + rand(8) }, () => String.fromCharCode(97 + rand(8)));
      script.push(["batch", shard, keys, "v".repeat(rand(50))]);
    }
    const held = play(budget, script);
    const unheld = play(undefined, script);
    assert.deepEqual(held.outputs, unheld.outputs, `round ${round}`);
    assert.deepEqual(held.h.stores(), unheld.h.stores(), `round ${round}, budget ${budget}`);
  }
});
