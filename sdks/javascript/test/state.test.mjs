// MapState and ListState outside a component: the key and value layout of
// the Rust SDK (guest-sdk/src/state/keys.rs, map.rs, list.rs), byte for
// byte, and the number of host calls. Run: sdks/javascript/test/run.sh

import { test, beforeEach } from "node:test";
import assert from "node:assert/strict";

import * as testing from "../testing.js";
import { ListState, MapKey, MapState, SluiceError, ValueState, __internals } from "../sluice.js";

const enc = new TextEncoder();
const dec = new TextDecoder();
/** Bytes from a string of chars 0..255, one byte each ("\x00", "\xff"). */
const b = (s) => Uint8Array.from(s, (c) => c.charCodeAt(0));
const calls = testing.calls;
/** The store as [key, value] strings (one char per byte for keys). */
const stored = () => testing.state().map(([k, v]) => [String.fromCharCode(...k), dec.decode(v)]);
/** An i64 map key's bytes: big-endian, sign bit flipped. */
const i64Key = (n) => {
  const out = new Uint8Array(8);
  new DataView(out.buffer).setBigUint64(0, BigInt.asUintN(64, BigInt(n) + (1n << 63n)));
  return out;
};

beforeEach(() => {
  testing.resetState();
  testing.reset();
});

test("key layouts are the Rust SDK's", () => {
  assert.deepEqual(new ValueState("count").key("user-1"), b("count\x00user-1"));
  assert.deepEqual(new ValueState("c").key(""), b("c\x00"));
  assert.deepEqual(new ListState("l").key("k"), b("l\x00k"));
  assert.deepEqual(new MapState("m").prefix("ab"), b("m\x00\x00\x00\x00\x02ab"));
  assert.deepEqual(new MapState("m").prefix(new Uint8Array()), b("m\x00\x00\x00\x00\x00"));
  assert.deepEqual(new MapState("m").key("ab", "x"), b("m\x00\x00\x00\x00\x02abx"));
  // Without the length, user key "a" + map key "b" would equal user key "ab".
  const a = dec.decode(new MapState("m").prefix("a"));
  const ab = dec.decode(new MapState("m").prefix("ab"));
  assert.ok(!ab.startsWith(a) && !a.startsWith(ab));
});

test("state names are checked", () => {
  assert.throws(() => new MapState(""), (e) => e instanceof SluiceError && e.message === "state name must not be empty");
  assert.throws(() => new ListState("a\0b"), (e) => e.message === 'state name "a\\0b" must not contain a 0x00 byte');
});

test("integer map keys sort numerically", () => {
  const U = 1n << 63n;
  const ks = [5n, -1n, -U, 0n, U - 1n, -300n];
  const encoded = ks.map((k) => MapKey.I64.encode(k)).sort((x, y) => Buffer.compare(x, y));
  assert.deepEqual(encoded.map((e) => MapKey.I64.decode(e)), [...ks].sort((x, y) => (x < y ? -1 : 1)));
  assert.deepEqual(MapKey.I32.encode(-1), new Uint8Array([0x7f, 0xff, 0xff, 0xff]));
  assert.equal(MapKey.I32.decode(new Uint8Array([0x7f, 0xff, 0xff, 0xff])), -1, "32 bits and less: numbers");
  assert.deepEqual(MapKey.U16.encode(258), new Uint8Array([1, 2]));
  assert.deepEqual(MapKey.I8.encode(-128), new Uint8Array([0]));
  assert.deepEqual(MapKey.U128.encode(1), new Uint8Array([...new Array(15).fill(0), 1]));
  assert.deepEqual(MapKey.I64.encode(-10), i64Key(-10), "numbers and BigInts encode alike");
  assert.equal(MapKey.U64.decode(MapKey.U64.encode(7)), 7n, "64 bits: BigInts");
  assert.throws(() => MapKey.U32.decode(new Uint8Array([1, 2])), (e) => e.message === "map key of 2 bytes is not a u32");
  assert.throws(() => MapKey.STR.decode(new Uint8Array([0xff])), SluiceError);
  assert.throws(() => MapKey.U8.encode(256), /out of the range of a u8/);
  assert.throws(() => MapKey.U8.encode(-1), /out of the range of a u8/);
  assert.throws(() => MapKey.I64.encode("1"), /not an integer/);
  assert.throws(() => MapKey.I64.encode(1.5), /not an integer/);
  assert.throws(() => MapKey.STR.encode(new Uint8Array([1])), /not a string/);
  assert.deepEqual(MapKey.BYTES.encode("é"), enc.encode("é"));
  assert.equal(new MapState("m").keyType, MapKey.STR);
  assert.equal(new MapState("m", { keyType: "bytes" }).keyType, MapKey.BYTES);
  assert.equal(new MapState("m", { keyType: "u32" }).keyType, MapKey.U32);
  assert.equal(new MapState("m", { keyType: MapKey.I128 }).keyType, MapKey.I128);
  assert.throws(() => new MapState("m", { keyType: "float" }), /unknown map key type/);
});

test("map state: layout and operations", () => {
  const m = new MapState("m");
  m.set("u", "b", 2);
  m.set("u", "a", 1);
  m.set("uu", "x", 9);
  m.set("u", "c", 3);
  m.remove("u", "c");
  assert.equal(m.get("u", "a"), 1);
  assert.equal(m.get("u", "c"), undefined);
  assert.equal(calls().get + calls().write + calls().scanPrefix, 0, "all served by the cache");
  assert.deepEqual(m.entries("u"), [["a", 1], ["b", 2]]);
  assert.equal(calls().write, 1, "the scan flushed pending writes first");
  assert.deepEqual(m.keys("uu"), ["x"]);
  const keys = stored().map(([k]) => k);
  assert.ok(keys.includes("m\x00\x00\x00\x00\x01ua") && keys.includes("m\x00\x00\x00\x00\x02uux"), keys.join());
  m.clear("u");
  assert.deepEqual(m.entries("u"), []);
  assert.equal(m.entries("uu").length, 1);
  assert.throws(() => m.get("u", 5), (e) => e.message === "state `m`: map key 5 is not a string");
});

test("map state: entries page through large maps", () => {
  const m = new MapState("big", { keyType: MapKey.U32 });
  const n = 1024 * 2 + 7;
  for (let i = 0; i < n; i++) m.set("k", i, i);
  const entries = m.entries("k");
  assert.equal(entries.length, n);
  assert.ok(entries.every(([k, v], i) => k === i && v === i));
  assert.equal(calls().scanPrefix, 3);
  m.clear("k");
  assert.deepEqual(m.keys("k"), []);
});

test("map state: signed keys come back in numeric order", () => {
  const m = new MapState("w", { keyType: "i64" });
  for (const k of [10, -10, 0, -(2n ** 63n)]) m.set(b("\x00"), k, String(k));
  assert.deepEqual(m.entries(b("\x00")).map(([k]) => k), [-(2n ** 63n), -10n, 0n, 10n]);
  testing.finish();
  const s = new Map(stored());
  assert.ok(s.has("w\x00\x00\x00\x00\x01\x00" + String.fromCharCode(...i64Key(10))));
  assert.equal(s.get("w\x00\x00\x00\x00\x01\x00" + String.fromCharCode(...i64Key(0))), '"0"');
});

test("list state: append keeps valid JSON, byte for byte as Rust", () => {
  const a = (l, i) => dec.decode(__internals.appendJson("l", l === undefined ? undefined : enc.encode(l), enc.encode(i)));
  assert.equal(a(undefined, "1"), "[1]");
  assert.equal(a("[]", "1"), "[1]");
  assert.equal(a(" [ ] \n", "1"), "[ 1]");
  assert.equal(a("[1,2]", '{"a":[3]}'), '[1,2,{"a":[3]}]');
  assert.equal(a('["x"] ', '"y"'), '["x","y"]');
  for (const bad of ["{}", "", "]", "\x0b[1]"]) assert.throws(() => a(bad, "1"), SluiceError, bad);
});

test("list state: push, get, set, clear", () => {
  const l = new ListState("l");
  l.push("k", [1, "a"]);
  l.push("k", [2, "b"]);
  assert.deepEqual(l.get("k"), [[1, "a"], [2, "b"]]);
  assert.equal(calls().get, 1);
  l.set("k", [[9, "z"]]);
  l.push("k", [10, "y"]);
  assert.equal(l.get("k").length, 2);
  testing.finish();
  assert.deepEqual(stored(), [["l\x00k", '[[9,"z"],[10,"y"]]']]);
  l.clear("k");
  assert.deepEqual(l.get("k"), []);
  assert.deepEqual(l.get("other"), []);
  l.prefetch(["a", "b"]);
  assert.equal(calls().getMany, 1);
});

test("list state: push onto a non-array is an error", () => {
  new ValueState("l2").set("k", 5);
  assert.throws(() => new ListState("l2").push("k", 1), (e) => e.message === "state `l2`: stored value is not a JSON array");
});

test("the call cache leaves the host holding what a plain map of the same writes holds", () => {
  // Calls of mixed operations over few keys, so that prefetches repeat keys
  // and meet cached ones, slots turn dirty again after a scan's flush, and
  // values are rewritten unchanged. A counter is read as it updates it.
  const v = new ValueState("v");
  const m = new MapState("m");
  const model = new Map();
  let seed = 7;
  const next = (n) => {
    seed = (seed * 1103515245 + 12345) % 2147483648;
    return Math.floor(seed / 65536) % n; // the high bits: the low ones cycle
  };
  const key = () => `k${next(12)}`;
  for (let call = 0; call < 300; call++) {
    testing.reset();
    for (let op = 0; op < 20; op++) {
      const k = key();
      switch (next(6)) {
        case 0:
          v.prefetch([k, key(), k, key()]);
          break;
        case 1: {
          const n = (model.get(k) ?? 0) + 1;
          assert.equal(v.update(k, (n) => (n ?? 0) + 1), n, `call ${call}: ${k}`);
          model.set(k, n);
          break;
        }
        case 2: {
          const n = next(3); // often what the host already holds
          v.set(k, n);
          model.set(k, n);
          break;
        }
        case 3:
          v.clear(k);
          model.delete(k);
          break;
        case 4:
          m.set("s", k, call);
          m.entries("s"); // flushes every pending write first
          break;
        default:
          assert.equal(v.get(k), model.get(k), `call ${call}: ${k}`);
      }
    }
    testing.finish();
  }
  const host = new Map(stored().filter(([k]) => k.startsWith("v\x00")).map(([k, raw]) => [k.slice(2), JSON.parse(raw)]));
  assert.deepEqual(host, model);
});

test("prefetch asks the host only for keys the call has not cached", () => {
  const v = new ValueState("v");
  v.set("a", 1); // dirty in the cache
  v.get("b"); // read into the cache: one get
  v.prefetch(["a", "b", "a"]);
  assert.equal(calls().getMany, 0, "every key was cached");
  v.prefetch(["a", "c", "c"]);
  assert.equal(calls().getMany, 1);
  assert.equal(v.get("a"), 1, "the dirty value, not the host's");
  assert.equal(calls().get, 1);
});
