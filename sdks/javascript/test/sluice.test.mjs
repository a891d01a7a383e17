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
import { Config, SluiceError, Transform, ValueState, exportTransform } from "../sluice.js";

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

async function runExample(dir, batchSize) {
  testing.resetState();
  const app = await import(new URL(`${dir}/app.js?bs=${batchSize}`, root).href);
  const lines = readFileSync(new URL(`${dir}/testdata/input.jsonl`, root), "utf8").trim().split("\n");
  app.init([]);
  const out = [];
  let batches = 0;
  for (let i = 0; i < lines.length; i += batchSize) {
    const batch = lines.slice(i, i + batchSize).map((l, j) => inputRecord(l, i + j));
    out.push(...app.process(batch).map(outputLine));
    batches++;
  }
  return { out, batches };
}

test("running-count matches its golden output at every batch size", async () => {
  const expected = readFileSync(new URL("examples/javascript/running-count/testdata/expected.jsonl", root), "utf8")
    .trim()
    .split("\n");
  for (const bs of [1, 3, 100]) {
    const { out, batches } = await runExample("examples/javascript/running-count", bs);
    assert.deepEqual(out, expected, `batch size ${bs}`);
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
