// Write sluice transforms in JavaScript: the package `sluice-guest`.
//
// A sluice transform is a WebAssembly component (world
// `sluice:transform/packed-out`, wit/sluice.wit: `timed`, whose exports
// `exportTransform` returns, plus the packed ones `packedExports` makes from
// them, which build.sh's entry adds) that the host feeds batches of
// Kafka records; it returns the records to write and keeps keyed state that
// the host checkpoints exactly once. This module is the JavaScript
// counterpart of the Rust crate `sluice-guest`: it hides the raw
// componentize-js bindings behind a small API.
//
// - `Transform`: extend it (`constructor(config)`, `beginBatch`, `process`,
//   `endBatch`, `onTimer`, `migrate`), then
//   `export const { init, process, migrate, onTimers } = exportTransform(MyTransform);`
// - `Record` and `Batch` to read input, `Emitter` to write.
// - `Config` for the job's settings (`durationMs` reads "1m 30s").
// - `ValueState`, `MapState` and `ListState`: keyed state (JSON values),
//   cached per call; `{ ttlMs }` or `.withTtl(ms)` makes entries expire.
// - `watermark()`, `processingTime()`, `Timer` and `record.isLate()`: event
//   time and timers (`Transform.onTimer` is called when one is due).
// - `Windows` (tumbling, hopping) and `SessionWindows`: event-time windows
//   built on state and timers.
// - `SluiceError`: throw it to fail the batch with a plain message.
// - `log.info(...)` and friends into the host's log; `console.log` and
//   friends are redirected there too.
//
// Example, a running count per key:
//
//     import { Transform, ValueState, exportTransform } from "sluice-guest";
//
//     const COUNTS = new ValueState("count");
//
//     class RunningCount extends Transform {
//       beginBatch(batch) {
//         COUNTS.prefetch(batch.keys());        // one state.get-many per batch
//       }
//       process(record, out) {
//         const n = COUNTS.update(record.keyOrEmpty(), (n) => (n ?? 0) + 1);
//         out.emit(record.keyOrEmpty(), String(n));
//       }
//     }
//
//     export const { init, process, migrate, onTimers } = exportTransform(RunningCount);
//
// Call lifecycle (as in the Rust SDK): for every batch, `beginBatch`, then
// `process` for each record in input order, then `endBatch`; then all state
// changes of the batch go to the host with one `state.write` and the emitted
// records are returned. When timers are due the host calls `on-timers`: the
// SDK first handles its own time-to-live timers, then calls `onTimer` for
// each other timer in order, then writes the state back as after a batch.
// `migrate` runs once per shard after an upgrade, its writes likewise.
// Anything thrown fails the whole call: outputs and unflushed state writes
// are dropped and the host replays from the last checkpoint. A throw never
// traps the instance; its message becomes the call's error
// (`record <topic>-<partition>@<offset>: <message>` when thrown from
// `process`, `timer Event "<key>"@<at>: <message>` from `onTimer`; a
// `SluiceError` gives its message alone, another `Error` `<name>: <message>`).
//
// State and key layout: identical to the Rust SDK ("Key layout" in
// guest-sdk/src/lib.rs), so a job can switch language and keep its state:
//
// - `ValueState` and `ListState` `name`, record key `k`: host key `name 0x00 k`;
// - `MapState` `name`, record key `k`, map key `m`:
//   `name 0x00 u32-be(len(k)) k m`, where `m` is UTF-8 for strings, raw for
//   bytes, big-endian for unsigned and big-endian with the sign bit flipped
//   for signed integers (`MapKey`).
//
// Values are compact JSON text (`JSON.stringify`, which is also what
// serde_json writes for integers, strings, arrays and objects); with a
// time-to-live, `[expires_at_ms, value]`. A write-back cache sits in front
// of the host for the length of one call: reads hit the host at most once
// per key (`prefetch` loads many keys with one `state.get-many`), writes stay
// in the guest until the call ends, and nothing is cached across calls
// because the host may roll state back between them.
//
// Times are milliseconds since the Unix epoch. The WIT's `s64` is a BigInt in
// componentize-js; the SDK hands out JS numbers (`record.timestamp`,
// `watermark()`, `timer.at`, `window.start`), exact up to 2^53 (the year
// 287,396), and keeps the exact BigInt next to them (`timestampBigInt`,
// `atBigInt`, `startBigInt`, ...). It accepts numbers or BigInts, and does its
// own time arithmetic (window bounds, expiry times) in BigInt, saturating at
// the s64 bounds as Rust's `saturating_*` does; a number at or beyond
// +-2^63 stands for the bound.
//
// Bytes are `Uint8Array`s. JSON numbers are JS numbers, exact up to 2^53.

// componentize-js resolves only the WIT package's exact version; build.sh
// rewrites these specifiers to the version in wit/sluice.wit.
import * as hostState from "sluice:transform/state@0.1.3";
import { log as hostLog } from "sluice:transform/log@0.1.3";
import * as hostTime from "sluice:transform/time@0.1.3";

/** The SDK's version: the `sluice-guest` package's (package.json). */
export const VERSION = "0.1.0";

const encoder = new TextEncoder();
const decoder = new TextDecoder("utf-8", { fatal: true });
const EMPTY = new Uint8Array(0);

/** @typedef {Uint8Array | string} Bytes  A string is encoded as UTF-8. */
/** @typedef {number | bigint} Millis  Milliseconds; a number must be a whole one. */

/** @param {Bytes} b @returns {Uint8Array} */
function toBytes(b) {
  // `typeof` first: interpreted, it costs far less than `instanceof`.
  if (typeof b === "string") return encoder.encode(b);
  if (b instanceof Uint8Array) return b;
  if (b instanceof ArrayBuffer || ArrayBuffer.isView(b)) return new Uint8Array(b.buffer ?? b, b.byteOffset ?? 0, b.byteLength);
  throw new SluiceError(`expected a Uint8Array or a string, got ${typeof b}`);
}

/** @param {Uint8Array} b @returns {string} */
function utf8(b) {
  try {
    return decoder.decode(b);
  } catch (e) {
    throw new SluiceError(`invalid UTF-8: ${e.message}`);
  }
}

function concatBytes(a, b) {
  const out = new Uint8Array(a.length + b.length);
  out.set(a);
  out.set(b, a.length);
  return out;
}

function startsWith(bytes, prefix) {
  if (bytes.length < prefix.length) return false;
  for (let i = 0; i < prefix.length; i++) if (bytes[i] !== prefix[i]) return false;
  return true;
}

function compareBytes(a, b) {
  const n = Math.min(a.length, b.length);
  for (let i = 0; i < n; i++) if (a[i] !== b[i]) return a[i] - b[i];
  return a.length - b.length;
}

/** A failure whose message is reported as is (no error-name prefix). */
export class SluiceError extends Error {
  constructor(message) {
    super(message);
    this.name = "SluiceError";
  }
}

// ---------------------------------------------------------------- i64 time

/** The bounds of the WIT's `s64`, as BigInts. */
export const I64_MIN = -(1n << 63n);
export const I64_MAX = (1n << 63n) - 1n;

/** `x` clamped to the s64 range: Rust's saturating arithmetic. @param {bigint} x */
function sat(x) {
  return x < I64_MIN ? I64_MIN : x > I64_MAX ? I64_MAX : x;
}

/**
 * A time (ms since the epoch) as an exact s64 BigInt. Numbers must be whole;
 * a number at or beyond +-2^63 (which cannot be exact) saturates, a BigInt
 * out of range is an error.
 */
function toI64(what, v) {
  if (typeof v === "bigint") {
    if (v < I64_MIN || v > I64_MAX) throw new SluiceError(`${what} ${v} is out of the s64 range`);
    return v;
  }
  if (typeof v !== "number" || !Number.isInteger(v)) {
    throw new SluiceError(`${what} must be an integer (ms since the Unix epoch), not ${String(v)}`);
  }
  return sat(BigInt(v));
}

/** A non-negative whole number of ms as a BigInt, at most I64_MAX. */
function toMillis(what, v) {
  if (typeof v !== "bigint" && (typeof v !== "number" || !Number.isInteger(v))) {
    throw new SluiceError(`${what} must be a whole number of milliseconds, not ${String(v)}`);
  }
  const ms = BigInt(v);
  if (ms < 0n) throw new SluiceError(`${what} must not be negative (got ${ms})`);
  return ms > I64_MAX ? I64_MAX : ms;
}

/** Rust's `i64::div_euclid` for a positive divisor. */
function divEuclid(a, b) {
  const q = a / b;
  return a % b < 0n ? q - 1n : q;
}

// ---------------------------------------------------------------- time

const UNSET = Symbol("unset");
let callWatermark = UNSET;
let callNow = UNSET;
/** The timers `setOncePerCall` has set in the running call (clock, time and key as a string). */
const callSet = new Set();

/**
 * Forgets the cached watermark and clock and the timers set once per call:
 * called as every export call begins.
 */
function newCall() {
  callWatermark = UNSET;
  callNow = UNSET;
  callSet.clear();
}

/**
 * Sets `timer` unless the running call has set it through here already:
 * windows set the same timer for every key's first record, and one crossing
 * per call does (setting a set timer does nothing).
 * @param {Timer} timer
 */
function setOncePerCall(timer) {
  const id = `${timer.clock} ${timer.atBigInt} ${mapKey(timer.key)}`;
  if (callSet.has(id)) return;
  callSet.add(id);
  timer.set();
}

/** The watermark as an exact BigInt, or undefined (one host call per call). */
function watermarkExact() {
  if (callWatermark === UNSET) {
    const w = hostTime.watermark();
    callWatermark = w === undefined || w === null ? undefined : BigInt(w);
  }
  return callWatermark;
}

/** The host's clock as an exact BigInt (one host call per call). */
function nowExact() {
  if (callNow === UNSET) callNow = BigInt(hostTime.processingTime());
  return callNow;
}

/**
 * The shard's watermark (ms since the Unix epoch) as of the start of this
 * call; `undefined` until every input partition of the shard has sent a
 * record or gone idle. One host call per call into the transform, however
 * often it is asked (it does not change during a call).
 * @returns {number | undefined}
 */
export function watermark() {
  const w = watermarkExact();
  return w === undefined ? undefined : Number(w);
}

/**
 * The host's clock (ms since the Unix epoch) as of the start of this call,
 * what processing-time timers are compared with (one host call per call).
 * @returns {number}
 */
export function processingTime() {
  return Number(nowExact());
}

const CLOCK_NAMES = { event: "Event", processing: "Processing" };

/**
 * A timer: `key` at `at` (ms since the Unix epoch) on `clock` ("event": the
 * shard's watermark; "processing": the host's wall clock).
 *
 * Timers are state of the shard: setting one in a call that fails sets
 * nothing, and a firing commits exactly once with its epoch. A shard holds at
 * most one timer per clock, key and time. `Timer.compare` orders them by
 * clock (event first), time, key, as the Rust SDK does.
 */
export class Timer {
  /**
   * @param {"event" | "processing"} clock
   * @param {Bytes} key
   * @param {Millis} at
   */
  constructor(clock, key, at) {
    if (clock !== "event" && clock !== "processing") {
      throw new SluiceError(`timer clock must be "event" or "processing", not ${String(clock)}`);
    }
    /** @type {"event" | "processing"} */
    this.clock = clock;
    /** @type {Uint8Array} */
    this.key = toBytes(key);
    /** The exact time, as the host has it. @type {bigint} */
    this.atBigInt = toI64("timer time", at);
  }

  /** An event-time timer: fires once the watermark reaches `at`. */
  static event(key, at) {
    return new Timer("event", key, at);
  }

  /** A processing-time timer: fires once the host's clock reaches `at`. */
  static processing(key, at) {
    return new Timer("processing", key, at);
  }

  /** A timer as the bindings hand it over (`{ clock, key, at }`, `at` a BigInt). */
  static fromWit(t) {
    return t instanceof Timer ? t : new Timer(t.clock, t.key, typeof t.at === "bigint" ? t.at : BigInt(t.at));
  }

  /** @returns {number} when it is due (exact up to 2^53; `atBigInt` always). */
  get at() {
    return Number(this.atBigInt);
  }

  /**
   * Sets it (setting a timer that is set already does nothing). An event-time
   * timer at or below the watermark fires right after this call.
   */
  set() {
    hostTime.setTimer(this.toWit());
  }

  /** Deletes it; deleting a timer that is not set does nothing. */
  delete() {
    hostTime.deleteTimer(this.toWit());
  }

  /** @returns {string} the key as UTF-8 text. */
  keyStr() {
    return utf8(this.key);
  }

  /** The WIT `time.timer` record. */
  toWit() {
    return { clock: this.clock, key: this.key, at: this.atBigInt };
  }

  /** @param {Timer} other @returns {boolean} */
  equals(other) {
    return other instanceof Timer && Timer.compare(this, other) === 0;
  }

  /** Orders timers by clock (event first), time, key. */
  static compare(a, b) {
    if (a.clock !== b.clock) return a.clock === "event" ? -1 : 1;
    if (a.atBigInt !== b.atBigInt) return a.atBigInt < b.atBigInt ? -1 : 1;
    return compareBytes(a.key, b.key);
  }

  toString() {
    return `Timer.${this.clock}(${debugStr(this.key)}, ${this.atBigInt})`;
  }
}

/** `b` as Rust's `{:?}` shows `String::from_utf8_lossy(b)` (close enough). */
function debugStr(b) {
  const text = new TextDecoder("utf-8").decode(b);
  let out = '"';
  for (const ch of text) {
    const c = ch.codePointAt(0);
    if (ch === '"' || ch === "\\") out += "\\" + ch;
    else if (c === 0) out += "\\0";
    else if (ch === "\t") out += "\\t";
    else if (ch === "\r") out += "\\r";
    else if (ch === "\n") out += "\\n";
    else if (c < 0x20 || (c >= 0x7f && c < 0xa0)) out += `\\u{${c.toString(16)}}`;
    else out += ch;
  }
  return out + '"';
}

// ------------------------------------------------------------------ records

/** One input record (wraps the WIT `input-record`). */
export class Record {
  constructor(inner) {
    /** @private */
    this.r = inner;
  }

  /** @returns {Uint8Array | undefined} the key; `undefined` for records without one. */
  get key() {
    return this.r.key;
  }

  /** @returns {Uint8Array} the key, or an empty array for records without one. */
  keyOrEmpty() {
    return this.r.key ?? EMPTY;
  }

  /** @returns {string} the key as UTF-8 text; throws if there is none. */
  keyStr() {
    if (this.r.key === undefined) throw new SluiceError("record has no key");
    return utf8(this.r.key);
  }

  /** @returns {Uint8Array | undefined} the value; `undefined` for a tombstone. */
  get value() {
    return this.r.value;
  }

  /** @returns {boolean} whether the record has no value. */
  isTombstone() {
    return this.r.value === undefined;
  }

  /** @returns {string} the value as UTF-8 text; throws for a tombstone. */
  valueStr() {
    if (this.r.value === undefined) throw new SluiceError("record has no value (tombstone)");
    return utf8(this.r.value);
  }

  /** @returns {any} the value decoded from JSON; throws for a tombstone or bad JSON. */
  json() {
    const text = this.valueStr();
    try {
      return JSON.parse(text);
    } catch (e) {
      throw new SluiceError(`invalid JSON: ${e.message}`);
    }
  }

  /** @returns {Array<[string, Uint8Array]>} the headers in record order. */
  get headers() {
    return this.r.headers.map((h) => [h.key, h.value]);
  }

  /** @returns {Uint8Array | undefined} the value of the last header called `name`. */
  header(name) {
    const hs = this.r.headers;
    for (let i = hs.length - 1; i >= 0; i--) if (hs[i].key === name) return hs[i].value;
    return undefined;
  }

  /** @returns {number | undefined} milliseconds since the Unix epoch, if present. */
  get timestamp() {
    return this.r.timestamp == null ? undefined : Number(this.r.timestamp);
  }

  /** @returns {bigint | undefined} the timestamp, exactly. */
  get timestampBigInt() {
    return this.r.timestamp == null ? undefined : BigInt(this.r.timestamp);
  }

  /**
   * Whether the record is late: its timestamp is at or below the shard's
   * `watermark()`, so windows that would hold it may have closed. A record
   * without a timestamp is never late. The host counts late records; nothing
   * drops them but the transform.
   * @returns {boolean}
   */
  isLate() {
    const ts = this.timestampBigInt;
    if (ts === undefined) return false;
    const w = watermarkExact();
    return w !== undefined && ts <= w;
  }

  /** @returns {string} */
  get topic() {
    return this.r.topic;
  }

  /** @returns {number} */
  get partition() {
    return this.r.partition;
  }

  /** @returns {number} the offset (a JS number: exact below 2^53). */
  get offset() {
    return Number(this.r.offset);
  }
}

/** The records of one `process` call, in input order (iterable). */
export class Batch {
  /** @param {Record[]} records */
  constructor(records) {
    this.records = records;
  }

  /** @returns {Uint8Array[]} every record's `keyOrEmpty()`, repeats included. */
  keys() {
    const records = this.records;
    const keys = new Array(records.length);
    for (let i = 0; i < records.length; i++) keys[i] = records[i].keyOrEmpty();
    return keys;
  }

  get length() {
    return this.records.length;
  }

  [Symbol.iterator]() {
    return this.records[Symbol.iterator]();
  }
}

/** Collects a call's output records; emitting never crosses into the host. */
export class Emitter {
  constructor() {
    this.records = [];
  }

  /**
   * Writes a record. Strings are encoded as UTF-8; a `null`/`undefined` key
   * means no key, a `null`/`undefined` value a tombstone. `topic` (default:
   * the job's first output topic) must be one of the job's output topics.
   *
   * @param {Bytes | null | undefined} key
   * @param {Bytes | null | undefined} value
   * @param {{ headers?: Array<[string, Bytes]>, topic?: string }} [options]
   */
  emit(key, value, options) {
    this.records.push({
      key: key == null ? undefined : toBytes(key),
      value: value == null ? undefined : toBytes(value),
      headers: options?.headers ? options.headers.map(([k, v]) => ({ key: k, value: toBytes(v) })) : [],
      topic: options?.topic,
    });
  }

  /** Like `emit`, with the value encoded as compact JSON. */
  emitJson(key, value, options) {
    this.emit(key, JSON.stringify(value), options);
  }

  /** Writes `record`'s key, value and headers unchanged. */
  forward(record, options) {
    const r = record.r;
    this.records.push({ key: r.key, value: r.value, headers: r.headers, topic: options?.topic });
  }

  get length() {
    return this.records.length;
  }
}

// ----------------------------------------------------------- packed strings
//
// The byte layouts of `packed-batch`, `packed-outputs` and the state calls'
// packed forms (wit/sluice.wit; little-endian, u32 lengths and counts): one
// byte string per call each way. componentize-js's glue runs interpreted and
// costs tens of microseconds per record object or state entry it converts;
// a byte string it copies whole.

/** A `SluiceError` for a packed string from the host that breaks its layout. */
function malformed(what, e) {
  return new SluiceError(`host bug: malformed ${what}: ${e instanceof Error ? e.message : e}`);
}

/** Throws unless a packed string of `end` bytes was read exactly to its end. */
function checkEnd(what, at, end) {
  if (at > end) throw malformed(what, `cut short, ${at - end} bytes missing`);
  if (at < end) throw malformed(what, `${end - at} bytes after the last entry`);
}

/**
 * The records of a `packed-batch`, shaped as the bindings' `input-record`s.
 * @param {Uint8Array} bytes
 */
function unpackBatch(bytes) {
  const what = "packed batch";
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const records = [];
  let at = 0;
  try {
    const partition = view.getInt32(0, true);
    const topicCount = view.getUint32(4, true);
    at = 8;
    const topics = [];
    for (let i = 0; i < topicCount; i++) {
      const n = view.getUint32(at, true);
      topics.push(decoder.decode(bytes.subarray(at + 4, at + 4 + n)));
      at += 4 + n;
    }
    const count = view.getUint32(at, true);
    at += 4;
    for (let i = 0; i < count; i++) {
      const flags = bytes[at];
      const topic = topics[view.getUint32(at + 1, true)];
      if (topic === undefined) throw malformed(what, `topic index ${view.getUint32(at + 1, true)} of ${topics.length}`);
      const offset = view.getBigInt64(at + 5, true);
      at += 13;
      let timestamp, key, value;
      if (flags & 4) {
        timestamp = view.getBigInt64(at, true);
        at += 8;
      }
      if (flags & 1) {
        const n = view.getUint32(at, true);
        key = bytes.slice(at + 4, at + 4 + n);
        at += 4 + n;
      }
      if (flags & 2) {
        const n = view.getUint32(at, true);
        value = bytes.slice(at + 4, at + 4 + n);
        at += 4 + n;
      }
      const headerCount = view.getUint32(at, true);
      at += 4;
      const headers = [];
      for (let h = 0; h < headerCount; h++) {
        const n = view.getUint32(at, true);
        const name = decoder.decode(bytes.subarray(at + 4, at + 4 + n));
        at += 4 + n;
        const m = view.getUint32(at, true);
        headers.push({ key: name, value: bytes.slice(at + 4, at + 4 + m) });
        at += 4 + m;
      }
      records.push({ key, value, headers, timestamp, topic, partition, offset });
    }
  } catch (e) {
    throw e instanceof SluiceError ? e : malformed(what, e);
  }
  checkEnd(what, at, bytes.byteLength);
  return records;
}

/**
 * Records shaped as the bindings' `output-record`s, as `packed-outputs`.
 * @param {Array<{key?: Bytes, value?: Bytes, headers?: Array<{key: string, value: Bytes}>, topic?: string}>} records
 */
function packOutputs(records) {
  // Pass 1: the size, with every key and value as bytes and every string
  // that needs encoding encoded, once. The loops index arrays rather than
  // iterate them: StarlingMonkey runs this interpreted (or weval'd), where
  // an iterator step is a call that allocates its result.
  const n = records.length;
  const keys = new Array(n);
  const values = new Array(n);
  const texts = [];
  let size = 4;
  for (let i = 0; i < n; i++) {
    const r = records[i];
    size += 5; // flags and the header count
    if (r.topic != null) {
      const t = encoder.encode(r.topic);
      texts.push(t);
      size += 4 + t.length;
    }
    if (r.key != null) size += 4 + (keys[i] = toBytes(r.key)).length;
    if (r.value != null) size += 4 + (values[i] = toBytes(r.value)).length;
    const headers = r.headers;
    if (headers) {
      for (let h = 0; h < headers.length; h++) {
        const k = encoder.encode(headers[h].key);
        const v = toBytes(headers[h].value);
        texts.push(k, v);
        size += 8 + k.length + v.length;
      }
    }
  }
  // Pass 2: the bytes.
  const out = new Uint8Array(size);
  const view = new DataView(out.buffer);
  let at = 4;
  let text = 0;
  view.setUint32(0, n, true);
  for (let i = 0; i < n; i++) {
    const r = records[i];
    const key = keys[i];
    const value = values[i];
    out[at++] = (key !== undefined ? 1 : 0) | (value !== undefined ? 2 : 0) | (r.topic != null ? 4 : 0);
    if (r.topic != null) at = putBytes(out, view, at, texts[text++]);
    if (key !== undefined) at = putBytes(out, view, at, key);
    if (value !== undefined) at = putBytes(out, view, at, value);
    const headerCount = r.headers ? r.headers.length : 0;
    view.setUint32(at, headerCount, true);
    at += 4;
    for (let h = 0; h < 2 * headerCount; h++) at = putBytes(out, view, at, texts[text++]);
  }
  return out;
}

/** Writes `b` at `at` of `out` (`view` over it) with its u32 length first; returns where it ends. */
function putBytes(out, view, at, b) {
  view.setUint32(at, b.length, true);
  out.set(b, at + 4);
  return at + 4 + b.length;
}

/**
 * The exports world `packed-out` adds to world `timed`, over a `timed`
 * `process` (the one `exportTransform` returns, or one written on the raw
 * bindings): `processPacked` and `processPackedOut` take a batch as one
 * byte string, and the second returns the outputs as one too, each telling
 * `process` the batch's shard; `holdState` and `flushState` let the SDK's
 * store hold a shard's state from one batch of the shard to the next (see
 * `Store`). build.sh's entry module exports them for every project.
 * @param {(batch: object[], shard?: number) => object[]} process
 */
export function packedExports(process) {
  // An error reading the batch or packing the outputs fails the call, with
  // its message as the error string.
  const failingAsString = (f) => (x) => {
    try {
      return f(x);
    } catch (e) {
      throw message(e);
    }
  };
  const unpack = failingAsString(unpackBatch);
  const pack = failingAsString(packOutputs);
  // The shard a batch's state calls are scoped to: its records' partition.
  const shardOf = (records) => (records.length > 0 && records[0].partition >= 0 ? records[0].partition : undefined);
  return {
    processPacked: (batch) => {
      const records = unpack(batch);
      return process(records, shardOf(records));
    },
    processPackedOut: (batch) => {
      const records = unpack(batch);
      return pack(process(records, shardOf(records)));
    },
    holdState: (maxBytes) => store.hold(maxBytes),
    flushState: (shard) => {
      try {
        store.giveBack(shard);
      } catch (e) {
        store.discard();
        throw message(e);
      }
    },
  };
}

/**
 * The host's `state` with `get-many` and `write` through their packed forms;
 * the other calls as they are.
 */
function packedState(host) {
  return {
    get: (key) => host.get(key),
    scanPrefix: (prefix, startAfter, limit) => host.scanPrefix(prefix, startAfter, limit),

    /** @param {Uint8Array[]} keys */
    getMany(keys) {
      let size = 4;
      for (let i = 0; i < keys.length; i++) size += 4 + keys[i].length;
      const packed = new Uint8Array(size);
      const out = new DataView(packed.buffer);
      out.setUint32(0, keys.length, true);
      let at = 4;
      for (let i = 0; i < keys.length; i++) at = putBytes(packed, out, at, keys[i]);
      const what = "state.get-many-packed result";
      const got = host.getManyPacked(packed);
      const view = new DataView(got.buffer, got.byteOffset, got.byteLength);
      const values = new Array(keys.length);
      at = 0;
      try {
        const count = view.getUint32(0, true);
        if (count !== keys.length) throw malformed(what, `${count} values for ${keys.length} keys`);
        at = 4;
        for (let i = 0; i < count; i++) {
          if (got[at] === 0) {
            values[i] = undefined;
            at += 1;
          } else {
            const n = view.getUint32(at + 1, true);
            values[i] = got.slice(at + 5, at + 5 + n);
            at += 5 + n;
          }
        }
      } catch (e) {
        throw e instanceof SluiceError ? e : malformed(what, e);
      }
      checkEnd(what, at, got.byteLength);
      return values;
    },

    /** @param {Array<[Uint8Array, Uint8Array | undefined]>} entries */
    write(entries) {
      let size = 4;
      for (let i = 0; i < entries.length; i++) {
        const v = entries[i][1];
        size += 5 + entries[i][0].length + (v === undefined ? 0 : 4 + v.length);
      }
      const packed = new Uint8Array(size);
      const view = new DataView(packed.buffer);
      view.setUint32(0, entries.length, true);
      let at = 4;
      for (let i = 0; i < entries.length; i++) {
        at = putBytes(packed, view, at, entries[i][0]);
        const v = entries[i][1];
        if (v === undefined) {
          packed[at++] = 0;
        } else {
          packed[at] = 1;
          at = putBytes(packed, view, at + 1, v);
        }
      }
      host.writePacked(packed);
    },
  };
}

// ------------------------------------------------------------------- config

/** The job's transform configuration; a repeated key keeps its last value. */
export class Config {
  /** @param {Array<[string, string]>} pairs */
  constructor(pairs = []) {
    this.map = new Map(pairs);
  }

  /** @returns {string | undefined} */
  get(name) {
    return this.map.get(name);
  }

  /** @returns {string} the value; throws if `name` is not set. */
  require(name) {
    if (!this.map.has(name)) throw new SluiceError(`missing required config key \`${name}\``);
    return this.map.get(name);
  }

  /**
   * `convert(value)`, `fallback` when not set; throws naming the key and the
   * value if `convert` throws or returns NaN. E.g. `config.parse("limit", Number, 10)`.
   */
  parse(name, convert, fallback) {
    if (!this.map.has(name)) return fallback;
    const raw = this.map.get(name);
    let v;
    try {
      v = convert(raw);
    } catch (e) {
      throw new SluiceError(`config key \`${name}\`: invalid value "${raw}": ${e.message ?? e}`);
    }
    if (typeof v === "number" && Number.isNaN(v)) {
      throw new SluiceError(`config key \`${name}\`: invalid value "${raw}": not a number`);
    }
    return v;
  }

  /**
   * The value of `name` as a duration such as `10s`, `1m 30s`, `500ms` or
   * `2h` (the job files' notation, as the Rust SDK's `Config::duration`
   * reads it), in whole milliseconds; `fallback` when not set. Throws naming
   * the key and the value when it does not parse.
   * @param {string} name
   * @param {number} [fallback]
   * @returns {number | undefined}
   */
  durationMs(name, fallback) {
    if (!this.map.has(name)) return fallback;
    const raw = this.map.get(name);
    try {
      return parseDurationMs(raw.trim());
    } catch (e) {
      throw new SluiceError(`config key \`${name}\`: invalid duration "${raw}" (e.g. 10s, 1m, 500ms): ${e.message}`);
    }
  }

  /** The value if it is one of `allowed`; `fallback` when not set. */
  choice(name, allowed, fallback) {
    if (!this.map.has(name)) return fallback;
    const v = this.map.get(name);
    if (!allowed.includes(v)) {
      const names = allowed.map((a) => `\`${a}\``).join(", ");
      throw new SluiceError(`config key \`${name}\`: unknown value "${v}"; expected one of ${names}`);
    }
    return v;
  }

  /** @returns {Array<[string, string]>} */
  entries() {
    return [...this.map.entries()];
  }

  get size() {
    return this.map.size;
  }
}

const DURATION_UNITS_NS = new Map();
for (const [names, ns] of [
  [["nanos", "nsec", "ns"], 1n],
  [["usec", "us", "\u00b5s"], 1_000n],
  [["millis", "msec", "ms"], 1_000_000n],
  [["seconds", "second", "secs", "sec", "s"], 1_000_000_000n],
  [["minutes", "minute", "mins", "min", "m"], 60n * 1_000_000_000n],
  [["hours", "hour", "hrs", "hr", "h"], 3_600n * 1_000_000_000n],
  [["days", "day", "d"], 86_400n * 1_000_000_000n],
  [["weeks", "week", "w"], 7n * 86_400n * 1_000_000_000n],
  [["months", "month", "M"], 2_630_016n * 1_000_000_000n], // 30.44 days, as humantime
  [["years", "year", "y"], 31_557_600n * 1_000_000_000n], // 365.25 days
]) {
  for (const n of names) DURATION_UNITS_NS.set(n, ns);
}

const isSpace = (c) => c === " " || c === "\t" || c === "\n" || c === "\r" || c === "\f" || c === "\v";
const isDigit = (c) => c >= "0" && c <= "9";
const isUnitChar = (c) => (c >= "a" && c <= "z") || (c >= "A" && c <= "Z") || c === "\u00b5";

/**
 * Milliseconds (rounded down) of a duration in humantime's notation: one or
 * more `<digits><unit>`, optionally separated by whitespace (the Python
 * SDK's port of what the Rust SDK accepts).
 */
function parseDurationMs(text) {
  if (!text) throw new Error("empty duration");
  let total = 0n;
  let i = 0;
  const n = text.length;
  while (i < n) {
    while (i < n && isSpace(text[i])) i++;
    let j = i;
    while (j < n && isDigit(text[j])) j++;
    if (j === i) throw new Error(`expected a number at ${i}`);
    const number = BigInt(text.slice(i, j));
    while (j < n && isSpace(text[j])) j++;
    let k = j;
    while (k < n && isUnitChar(text[k])) k++;
    const unit = text.slice(j, k);
    if (!unit && k < n) throw new Error(`invalid character at ${k}`);
    const ns = DURATION_UNITS_NS.get(unit);
    if (ns === undefined) {
      throw new Error(`unknown time unit "${unit}", supported units: ns, us, ms, s, m, h, d, w, M, y`);
    }
    total += number * ns;
    if (k < n && !isSpace(text[k]) && !isDigit(text[k])) throw new Error(`invalid character at ${k}`);
    i = k;
  }
  if (total / 1_000_000_000n >= 1n << 64n) throw new Error("number is too large");
  return Number(total / 1_000_000n);
}

// -------------------------------------------------------------------- state

// The bytes of a host key as a string, one char per byte: the cache's map key.
function mapKey(bytes) {
  if (bytes.length < 4096) return String.fromCharCode.apply(null, bytes);
  let s = "";
  for (let i = 0; i < bytes.length; i += 4096) s += String.fromCharCode.apply(null, bytes.subarray(i, i + 4096));
  return s;
}

function sameBytes(a, b) {
  if (a === b) return true;
  if (a === undefined || b === undefined || a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}

// What a cached entry costs besides its key (twice: bytes and the map's
// string) and value: the slot, the map's entry and the typed arrays'
// objects, rounded up.
const ENTRY_BYTES = 160;

const entrySize = (key, value) => ENTRY_BYTES + 2 * key.length + (value === undefined ? 0 : value.length);

// What a shard's cache costs besides its entries: its map and dirty list,
// empty, and its place among the parked.
const CACHE_BYTES = 1024;

// The write-back cache in front of the host's `state`. `entries` holds every
// key read or written: { key, value, dirty } (value `undefined`: absent or
// deleted), under `mk`, the host key as a one-char-per-byte string; `dirty`
// lists the slots the host has yet to hear about, in the order they became
// dirty; `bytes` what the cache holds, by `entrySize`. The hot paths pass
// the state and the record key, so the host key's bytes are only built on a
// miss; `readKey`/`writeKey` take the host key's bytes. Loops index arrays
// rather than iterate maps: interpreted, an iterator step is a call that
// allocates its result.
//
// A call's cache ends with the call (written back, then forgotten), unless
// the host has said it will ask for held state back (`hold`): then the
// cache of a batch's shard stays from one batch of the shard to the next,
// within `maxHeld` bytes over all shards, until `giveBack` (the host's
// `flush-state`). The shard being served is `holding`; other held shards
// wait in `parked`. This is the Rust SDK's store.
class Store {
  constructor(backend) {
    this.backend = backend;
    this.entries = new Map();
    /** @type {Array<{ key: Uint8Array, value: Uint8Array | undefined, dirty: boolean }>} */
    this.dirty = [];
    this.bytes = 0;
    this.maxHeld = 0;
    /** @type {number | undefined} */
    this.holding = undefined;
    /** @type {Map<number, { entries: Map<string, object>, dirty: object[], bytes: number }>} */
    this.parked = new Map();
    this.parkedBytes = 0;
  }

  // The host's `hold-state`: batches' caches may stay, up to `maxBytes`.
  hold(maxBytes) {
    this.maxHeld = Math.max(0, Number(maxBytes));
  }

  // Starts a call for `shard` (undefined: a call without one, or nothing
  // may be held): the shard's held cache, if any, becomes the cache, and the
  // one held before is parked. What an unheld call left (only state used
  // outside any call does) is dropped.
  begin(shard) {
    if (this.maxHeld === 0) shard = undefined;
    if (shard !== undefined && shard === this.holding) return;
    if (this.holding !== undefined && this.entries.size > 0) {
      this.parked.set(this.holding, { entries: this.entries, dirty: this.dirty, bytes: this.bytes });
      this.parkedBytes += this.bytes;
    }
    const cache = shard === undefined ? undefined : this.parked.get(shard);
    if (cache === undefined) {
      this.entries = new Map();
      this.dirty = [];
      this.bytes = 0;
    } else {
      this.parked.delete(shard);
      this.parkedBytes -= cache.bytes;
      this.entries = cache.entries;
      this.dirty = cache.dirty;
      this.bytes = cache.bytes;
    }
    this.holding = shard;
  }

  // Ends a call that succeeded: a shard's cache stays while everything held
  // is within `maxHeld`; anything else is written back.
  end() {
    const caches = CACHE_BYTES * (1 + this.parked.size);
    if (this.holding !== undefined && this.bytes + this.parkedBytes + caches <= this.maxHeld) return;
    this.holding = undefined;
    this.finish();
  }

  // The host's `flush-state`: writes back what is held of `shard` and
  // forgets it.
  giveBack(shard) {
    this.begin(shard);
    this.holding = undefined;
    this.finish();
  }

  read(mk, state, k) {
    const slot = this.entries.get(mk);
    if (slot !== undefined) return slot.value;
    const key = state.key(k);
    const value = this.backend.get(key);
    this.entries.set(mk, { key, value, dirty: false });
    this.bytes += entrySize(key, value);
    return value;
  }

  readKey(key) {
    const mk = mapKey(key);
    const slot = this.entries.get(mk);
    if (slot !== undefined) return slot.value;
    const value = this.backend.get(key);
    this.entries.set(mk, { key, value, dirty: false });
    this.bytes += entrySize(key, value);
    return value;
  }

  // Loads the entries of record keys `ks` (cache keys `mks`) that the cache
  // lacks with one `get-many`, each distinct key once.
  prefetch(state, mks, ks) {
    const entries = this.entries;
    const missing = new Set();
    const wanted = []; // the cache keys of `keys`, in order
    const keys = [];
    for (let i = 0; i < mks.length; i++) {
      const mk = mks[i];
      if (entries.has(mk) || missing.has(mk)) continue;
      missing.add(mk);
      wanted.push(mk);
      keys.push(state.key(ks[i]));
    }
    if (keys.length === 0) return;
    const values = this.backend.getMany(keys);
    if (values.length !== keys.length) {
      throw new SluiceError(`host bug: state.get-many returned ${values.length} values for ${keys.length} keys`);
    }
    let bytes = 0;
    for (let i = 0; i < keys.length; i++) {
      entries.set(wanted[i], { key: keys[i], value: values[i], dirty: false });
      bytes += entrySize(keys[i], values[i]);
    }
    this.bytes += bytes;
  }

  write(mk, state, k, value) {
    const slot = this.entries.get(mk);
    if (slot === undefined) this.newDirty(mk, state.key(k), value);
    else this.update(slot, value);
  }

  writeKey(key, value) {
    const mk = mapKey(key);
    const slot = this.entries.get(mk);
    if (slot === undefined) this.newDirty(mk, key, value);
    else this.update(slot, value);
  }

  newDirty(mk, key, value) {
    const slot = { key, value, dirty: true };
    this.entries.set(mk, slot);
    this.dirty.push(slot);
    this.bytes += entrySize(key, value);
  }

  update(slot, value) {
    if (!slot.dirty) {
      if (sameBytes(slot.value, value)) return; // the host already has exactly this
      slot.dirty = true;
      this.dirty.push(slot);
    }
    this.bytes += (value === undefined ? 0 : value.length) - (slot.value === undefined ? 0 : slot.value.length);
    slot.value = value;
  }

  // The dirty entries as `state.write` takes them, marked clean.
  takeDirty() {
    const dirty = this.dirty;
    const writes = new Array(dirty.length);
    for (let i = 0; i < dirty.length; i++) {
      const slot = dirty[i];
      writes[i] = [slot.key, slot.value];
      slot.dirty = false;
    }
    this.dirty = [];
    return writes;
  }

  // Sends pending writes with one `state.write` and keeps the cache.
  flush() {
    if (this.dirty.length > 0) this.backend.write(this.takeDirty());
  }

  // One page of `state.scan-prefix`, after flushing pending writes so the
  // host sees them.
  scan(prefix, startAfter, limit) {
    this.flush();
    return this.backend.scanPrefix(prefix, startAfter, limit);
  }

  // Ends the cache: one `state.write` with every dirty entry, then forgets all.
  finish() {
    this.bytes = 0;
    if (this.dirty.length > 0) {
      const writes = this.takeDirty();
      this.entries = new Map();
      this.backend.write(writes);
    } else {
      this.entries.clear();
    }
  }

  // Ends a failed call: drops every cache, held ones too, with their unsent
  // writes (the host ends the instance and rolls its epoch back).
  discard() {
    this.entries = new Map();
    this.dirty = [];
    this.bytes = 0;
    this.parked.clear();
    this.parkedBytes = 0;
    this.holding = undefined;
  }
}

const store = new Store(packedState(hostState));

/** Checks a state name (non-empty, no NUL) and returns its UTF-8 bytes. */
function checkName(name) {
  if (typeof name !== "string" || name.length === 0) throw new SluiceError("state name must not be empty");
  if (name.includes("\0")) throw new SluiceError(`state name "${name.replace(/\0/g, "\\0")}" must not contain a 0x00 byte`);
  return encoder.encode(name);
}

function jsonEncode(name, value) {
  const text = JSON.stringify(value);
  if (text === undefined) throw new SluiceError(`state \`${name}\`: value cannot be encoded as JSON`);
  return text;
}

function jsonDecode(name, raw) {
  // Counters take a fast path: a plain non-negative integer of at most 15
  // digits (exact as a number) without a call into the text decoder.
  const n = raw.length;
  if (n > 0 && n <= 15 && (raw[0] !== 0x30 || n === 1)) {
    let v = 0;
    let i = 0;
    for (; i < n; i++) {
      const d = raw[i] - 0x30;
      if (d < 0 || d > 9) break;
      v = v * 10 + d;
    }
    if (i === n) return v;
  }
  try {
    return JSON.parse(decoder.decode(raw));
  } catch (e) {
    throw new SluiceError(`state \`${name}\`: invalid JSON: ${e.message}`);
  }
}

// -- time-to-live

/**
 * The first bytes of every expiry timer's key, followed by the entry's state
 * key (no state name is empty, so window timers never begin with them).
 */
const TTL_TIMER_PREFIX = new Uint8Array([0, 0x74, 0x74, 0x6c, 0]); // "\0ttl\0"
const EXPIRED = Symbol("expired");
// `[expires_at, ...`: the exact expiry (JSON.parse would round it).
const TTL_HEAD = /^[ \t\n\r]*\[[ \t\n\r]*(-?(?:0|[1-9][0-9]*))[ \t\n\r]*,/;

function ttlOption(name, ttlMs) {
  return ttlMs === undefined || ttlMs === null ? 0n : toMillis(`state \`${name}\`: the time-to-live`, ttlMs);
}

/** The stored form of `value` with a time-to-live, `[expires_at, value]`, its expiry timer set. */
function ttlEncode(name, ttl, stateKey, value) {
  const expiresAt = sat(nowExact() + ttl);
  new Timer("processing", concatBytes(TTL_TIMER_PREFIX, stateKey), expiresAt).set();
  return encoder.encode(`[${expiresAt},${jsonEncode(name, value)}]`);
}

/** `[expiresAt (BigInt), value]` from `[expires_at, value]`; undefined if it is not that. */
function ttlParse(raw) {
  let text;
  try {
    text = decoder.decode(raw);
  } catch {
    return undefined;
  }
  const head = TTL_HEAD.exec(text);
  if (head === null) return undefined;
  const expiresAt = BigInt(head[1]);
  if (expiresAt < I64_MIN || expiresAt > I64_MAX) return undefined;
  let pair;
  try {
    pair = JSON.parse(text);
  } catch {
    return undefined;
  }
  if (!Array.isArray(pair) || pair.length !== 2) return undefined;
  return [expiresAt, pair[1]];
}

/** The value stored as `raw` with a time-to-live; `EXPIRED` once it has expired. */
function ttlDecode(name, raw) {
  const pair = ttlParse(raw);
  if (pair === undefined) {
    jsonDecode(name, raw); // throws for text that is not JSON at all
    throw new SluiceError(`state \`${name}\`: invalid JSON: expected [expires_at, value], a state with a time-to-live`);
  }
  return pair[0] > nowExact() ? pair[1] : EXPIRED;
}

/**
 * If `timer` is an expiry timer, deletes its entry unless it was written
 * again with a later expiry, and returns true; false for any other timer.
 */
function expire(timer) {
  if (timer.clock !== "processing" || !startsWith(timer.key, TTL_TIMER_PREFIX)) return false;
  const key = timer.key.subarray(TTL_TIMER_PREFIX.length);
  const raw = store.readKey(key);
  if (raw !== undefined) {
    const pair = ttlParse(raw);
    if (pair !== undefined && pair[0] <= timer.atBigInt) store.writeKey(key, undefined);
  }
  return true;
}

// -- value state

/**
 * What value and list state share: one entry per record key, under
 * `name 0x00 key`, read and written through the call's cache.
 */
class KeyedEntry {
  /** @param {string} name non-empty, no NUL character, unique among the states. */
  constructor(name) {
    const n = checkName(name);
    this.name = name;
    this.prefix = new Uint8Array(n.length + 1);
    this.prefix.set(n);
    this.prefixKey = mapKey(this.prefix);
  }

  /** @param {Bytes} key @returns {Uint8Array} the host key: `name 0x00 key`. */
  key(key) {
    return concatBytes(this.prefix, toBytes(key));
  }

  /** Removes the entry for `key`. */
  clear(key) {
    const k = toBytes(key);
    store.write(this.prefixKey + mapKey(k), this, k, undefined);
  }

  /**
   * Loads the entries of all `keys` into the call's cache with one
   * `state.get-many`; call it from `beginBatch` with `batch.keys()`.
   * @param {Iterable<Bytes>} keys
   */
  prefetch(keys) {
    const ks = Array.isArray(keys) ? keys : [...keys];
    const mks = new Array(ks.length);
    const bytes = new Array(ks.length);
    for (let i = 0; i < ks.length; i++) {
      const k = toBytes(ks[i]);
      bytes[i] = k;
      mks[i] = this.prefixKey + mapKey(k);
    }
    store.prefetch(this, mks, bytes);
  }
}

/**
 * One JSON value per record key, stored under `name 0x00 key`.
 *
 * Create it once at module level (it is only a name). Keys are `Uint8Array`s
 * or strings (UTF-8); values anything `JSON.stringify` encodes. Every call
 * goes through the per-call cache, so only `prefetch` and cache misses cross
 * into the host.
 *
 * With `{ ttlMs }` (or `withTtl(ms)`), a value expires that many ms of
 * processing time after it was last written: an expired value is never
 * returned, and an expiry timer removes it from the store. The stored form is
 * then `[expires_at_ms, value]`, so add or remove a TTL only with a
 * `migrate` hook.
 */
export class ValueState extends KeyedEntry {
  /**
   * @param {string} name non-empty, no NUL character, unique among the states.
   * @param {{ ttlMs?: Millis }} [options]
   */
  constructor(name, options) {
    super(name);
    this.ttl = ttlOption(name, options?.ttlMs);
  }

  /** @returns {number} the time-to-live in ms; 0: none. */
  get ttlMs() {
    return Number(this.ttl);
  }

  /** The same state with a time-to-live of `ms` (0: none). @param {Millis} ms */
  withTtl(ms) {
    return new this.constructor(this.name, { ttlMs: ms });
  }


  /** The value stored as `raw`; undefined when absent or expired. */
  decode(raw) {
    if (raw === undefined) return undefined;
    if (this.ttl > 0n) {
      const v = ttlDecode(this.name, raw);
      return v === EXPIRED ? undefined : v;
    }
    return jsonDecode(this.name, raw);
  }

  /** The stored form of `value` under record key `k` (bytes). */
  encode(value, k) {
    if (this.ttl > 0n) return ttlEncode(this.name, this.ttl, this.key(k), value);
    return encoder.encode(jsonEncode(this.name, value));
  }

  /** @returns {any} the value for `key`, or `undefined` when there is none (or it expired). */
  get(key) {
    const k = toBytes(key);
    return this.decode(store.read(this.prefixKey + mapKey(k), this, k));
  }

  /** Stores `value` for `key`. */
  set(key, value) {
    const k = toBytes(key);
    store.write(this.prefixKey + mapKey(k), this, k, this.encode(value, k));
  }

  /**
   * Replaces the value for `key` with `f(current)` (`current` is `undefined`
   * when absent or expired) and returns the new value.
   */
  update(key, f) {
    const k = toBytes(key);
    const mk = this.prefixKey + mapKey(k);
    const next = f(this.decode(store.read(mk, this, k)));
    store.write(mk, this, k, this.encode(next, k));
    return next;
  }


}

// -- list state

// What Rust's `trim_ascii` trims: space, \t, \n, \x0c, \r (not \x0b).
const isAsciiWs = (b) => b === 0x20 || b === 0x09 || b === 0x0a || b === 0x0c || b === 0x0d;

function trimAscii(bytes) {
  let s = 0;
  let e = bytes.length;
  while (s < e && isAsciiWs(bytes[s])) s++;
  while (e > s && isAsciiWs(bytes[e - 1])) e--;
  return bytes.subarray(s, e);
}

/**
 * Appends the JSON `item` (bytes) to the JSON array `current` without parsing
 * the array's elements: byte for byte what the Rust SDK writes.
 */
function appendJson(name, current, item) {
  if (current === undefined) {
    const out = new Uint8Array(item.length + 2);
    out[0] = 0x5b;
    out.set(item, 1);
    out[item.length + 1] = 0x5d;
    return out;
  }
  const trimmed = trimAscii(current);
  if (trimmed.length < 2 || trimmed[0] !== 0x5b || trimmed[trimmed.length - 1] !== 0x5d) {
    throw new SluiceError(`state \`${name}\`: stored value is not a JSON array`);
  }
  const comma = trimAscii(trimmed.subarray(1, trimmed.length - 1)).length > 0 ? 1 : 0;
  const out = new Uint8Array(trimmed.length - 1 + comma + item.length + 1);
  out.set(trimmed.subarray(0, trimmed.length - 1));
  if (comma) out[trimmed.length - 1] = 0x2c;
  out.set(item, trimmed.length - 1 + comma);
  out[out.length - 1] = 0x5d;
  return out;
}

/**
 * A list per record key, stored as one JSON array under `name 0x00 key`.
 *
 * `push` appends to the encoded array without decoding it, but every push
 * still copies the whole value: keep lists short, or use `MapState`.
 */
export class ListState extends KeyedEntry {
  /** Appends `item` to the list for `key`. */
  push(key, item) {
    const k = toBytes(key);
    const mk = this.prefixKey + mapKey(k);
    const next = appendJson(this.name, store.read(mk, this, k), encoder.encode(jsonEncode(this.name, item)));
    store.write(mk, this, k, next);
  }

  /** @returns {any[]} the list for `key`; empty if there is none. */
  get(key) {
    const k = toBytes(key);
    const raw = store.read(this.prefixKey + mapKey(k), this, k);
    if (raw === undefined) return [];
    const v = jsonDecode(this.name, raw);
    if (!Array.isArray(v)) throw new SluiceError(`state \`${this.name}\`: invalid JSON: expected a JSON array`);
    return v;
  }

  /** Replaces the list for `key`. @param {Iterable<any>} items */
  set(key, items) {
    const k = toBytes(key);
    store.write(this.prefixKey + mapKey(k), this, k, encoder.encode(jsonEncode(this.name, [...items])));
  }
}

// -- map state

/**
 * How a `MapState`'s map keys become bytes (part of the cross-language key
 * layout): `MapKey.STR` UTF-8, `MapKey.BYTES` as is, the unsigned integers
 * `U8` .. `U128` big-endian, the signed `I8` .. `I128` big-endian with the
 * sign bit flipped. So a map's entries come back in key order, numerically
 * for integers. Integer keys are numbers or BigInts; they decode as numbers
 * up to 32 bits and as BigInts for 64 and 128 bits.
 */
export class MapKey {
  /** @param {string} name @param {"str" | "bytes" | "int"} kind */
  constructor(name, kind, bits = 0, signed = false) {
    this.name = name;
    this.kind = kind;
    this.width = bits / 8;
    this.bits = BigInt(bits);
    this.offset = signed ? 1n << BigInt(bits - 1) : 0n;
    Object.freeze(this);
  }

  /** @returns {Uint8Array} the bytes of map key `value`. */
  encode(value) {
    if (this.kind === "str") {
      if (typeof value !== "string") throw new SluiceError(`map key ${String(value)} is not a string`);
      return encoder.encode(value);
    }
    if (this.kind === "bytes") {
      if (typeof value !== "string" && !(value instanceof Uint8Array) && !ArrayBuffer.isView(value)) {
        throw new SluiceError(`map key ${String(value)} is not bytes`);
      }
      return toBytes(value);
    }
    if (typeof value !== "bigint" && !Number.isInteger(value)) {
      throw new SluiceError(`map key ${String(value)} is not an integer (${this.name})`);
    }
    let u = BigInt(value) + this.offset;
    if (u < 0n || u >= 1n << this.bits) throw new SluiceError(`map key ${value} is out of the range of a ${this.name}`);
    const out = new Uint8Array(this.width);
    for (let i = this.width - 1; i >= 0; i--) {
      out[i] = Number(u & 0xffn);
      u >>= 8n;
    }
    return out;
  }

  /** The map key whose bytes are `raw`. */
  decode(raw) {
    if (this.kind === "str") return utf8(raw);
    if (this.kind === "bytes") return Uint8Array.from(raw);
    if (raw.length !== this.width) throw new SluiceError(`map key of ${raw.length} bytes is not a ${this.name}`);
    let u = 0n;
    for (const b of raw) u = (u << 8n) | BigInt(b);
    const v = u - this.offset;
    return this.width <= 4 ? Number(v) : v;
  }

  /**
   * The `MapKey` for `keyType`: a `MapKey`, or one of the names "str",
   * "string", "bytes", "u8" .. "u128", "i8" .. "i128".
   */
  static of(keyType) {
    if (keyType instanceof MapKey) return keyType;
    const found = typeof keyType === "string" ? MAP_KEY_TYPES.get(keyType) : undefined;
    if (found === undefined) {
      throw new SluiceError(`unknown map key type ${String(keyType)}: use "str", "bytes", "u32", "i64", ... or a MapKey`);
    }
    return found;
  }

  toString() {
    return `MapKey.${this.name.toUpperCase()}`;
  }
}

MapKey.STR = new MapKey("str", "str");
MapKey.BYTES = new MapKey("bytes", "bytes");
const MAP_KEY_TYPES = new Map([
  ["str", MapKey.STR],
  ["string", MapKey.STR],
  ["bytes", MapKey.BYTES],
]);
for (const bits of [8, 16, 32, 64, 128]) {
  MapKey[`U${bits}`] = new MapKey(`u${bits}`, "int", bits);
  MapKey[`I${bits}`] = new MapKey(`i${bits}`, "int", bits, true);
  MAP_KEY_TYPES.set(`u${bits}`, MapKey[`U${bits}`]);
  MAP_KEY_TYPES.set(`i${bits}`, MapKey[`I${bits}`]);
}

/** Entries asked for per `state.scan-prefix` call. */
const PAGE = 1024;

/**
 * A map per record key, each entry its own state entry under
 * `name 0x00 u32-be(len(key)) key map-key`, the value as JSON.
 *
 * `keyType` says how map keys are encoded (`MapKey`; default "str"). Point
 * reads and writes go through the per-call cache like `ValueState`;
 * `entries`, `keys` and `clear` page through the host's `scan-prefix` (1024
 * entries a call) after flushing the call's pending writes. `ttlMs` (or
 * `withTtl`) gives each entry a time-to-live, as for `ValueState`.
 */
export class MapState {
  /**
   * @param {string} name
   * @param {{ keyType?: MapKey | string, ttlMs?: Millis }} [options]
   */
  constructor(name, options) {
    this.nameBytes = checkName(name);
    this.name = name;
    this.keyType = MapKey.of(options?.keyType ?? "str");
    this.ttl = ttlOption(name, options?.ttlMs);
  }

  /** @returns {number} the time-to-live in ms; 0: none. */
  get ttlMs() {
    return Number(this.ttl);
  }

  /** The same state with a time-to-live of `ms` per entry (0: none). @param {Millis} ms */
  withTtl(ms) {
    return new this.constructor(this.name, { keyType: this.keyType, ttlMs: ms });
  }

  /** @returns {Uint8Array} `name 0x00 u32-be(len(key)) key`: what all of `key`'s entries' host keys begin with. */
  prefix(key) {
    const k = toBytes(key);
    if (k.length > 0xffffffff) throw new SluiceError(`state \`${this.name}\`: key of ${k.length} bytes is too long for a map key`);
    const n = this.nameBytes.length;
    const out = new Uint8Array(n + 5 + k.length);
    out.set(this.nameBytes);
    new DataView(out.buffer).setUint32(n + 1, k.length, false);
    out.set(k, n + 5);
    return out;
  }

  /** @returns {Uint8Array} the host key of `mapKey` in `key`'s map. */
  key(key, mapKey) {
    let m;
    try {
      m = this.keyType.encode(mapKey);
    } catch (e) {
      throw new SluiceError(`state \`${this.name}\`: ${e.message}`);
    }
    return concatBytes(this.prefix(key), m);
  }

  decode(raw) {
    if (this.ttl > 0n) return ttlDecode(this.name, raw);
    return jsonDecode(this.name, raw);
  }

  /** @returns {any} the value under `mapKey` in `key`'s map, or `undefined`. */
  get(key, mapKey) {
    const raw = store.readKey(this.key(key, mapKey));
    if (raw === undefined) return undefined;
    const v = this.decode(raw);
    return v === EXPIRED ? undefined : v;
  }

  /** Stores `value` under `mapKey` in `key`'s map. */
  set(key, mapKey, value) {
    const k = this.key(key, mapKey);
    store.writeKey(k, this.ttl > 0n ? ttlEncode(this.name, this.ttl, k, value) : encoder.encode(jsonEncode(this.name, value)));
  }

  /** Removes `mapKey` from `key`'s map. */
  remove(key, mapKey) {
    store.writeKey(this.key(key, mapKey), undefined);
  }

  /** @returns {Array<[any, any]>} all live entries of `key`'s map as `[mapKey, value]`, in map-key byte order. */
  entries(key) {
    const out = [];
    this.scan(key, (mk, raw) => {
      const v = this.decode(raw);
      if (v !== EXPIRED) out.push([this.decodeKey(mk), v]);
    });
    return out;
  }

  /** @returns {any[]} the map keys of `key`'s live entries, in byte order. */
  keys(key) {
    const out = [];
    this.scan(key, (mk, raw) => {
      if (this.ttl === 0n || this.decode(raw) !== EXPIRED) out.push(this.decodeKey(mk));
    });
    return out;
  }

  /** Removes every entry of `key`'s map. */
  clear(key) {
    const prefix = this.prefix(key);
    const doomed = [];
    this.scan(key, (mk) => doomed.push(concatBytes(prefix, mk)));
    for (const k of doomed) store.writeKey(k, undefined);
  }

  decodeKey(raw) {
    try {
      return this.keyType.decode(raw);
    } catch (e) {
      throw new SluiceError(`state \`${this.name}\`: ${e.message}`);
    }
  }

  /** Calls `f(mapKeyBytes, valueBytes)` for every entry of `key`'s map, paging through `scan-prefix`. */
  scan(key, f) {
    const prefix = this.prefix(key);
    let after;
    for (;;) {
      const page = store.scan(prefix, after, PAGE);
      for (const [k, v] of page) {
        if (!startsWith(k, prefix) || (after !== undefined && compareBytes(k, after) <= 0)) {
          throw new SluiceError(
            `host bug: state.scan-prefix returned a key out of order or outside the prefix (state \`${this.name}\`)`,
          );
        }
        f(k.subarray(prefix.length), v);
        after = k;
      }
      if (page.length < PAGE) return;
    }
  }
}

// ------------------------------------------------------------------ windows

/** A window that closed: its record key, its bounds and its accumulator. */
export class Window {
  constructor(key, start, end, value) {
    /** @type {Uint8Array} the record key the window belongs to. */
    this.key = key;
    /** @type {bigint} its first millisecond, exactly. */
    this.startBigInt = start;
    /** @type {bigint} its end (exclusive), exactly. */
    this.endBigInt = end;
    /** The accumulator. */
    this.value = value;
  }

  /** @returns {number} its first millisecond. */
  get start() {
    return Number(this.startBigInt);
  }

  /** @returns {number} its end, exclusive. */
  get end() {
    return Number(this.endBigInt);
  }

  /** @returns {string} the key as UTF-8 text. */
  keyStr() {
    return utf8(this.key);
  }
}

/**
 * The record key a timer of windows whose timer keys begin `prefix`
 * (`name 0x00`) is for: sessions, and tumbling or hopping windows stored by
 * an earlier SDK.
 */
function timerRecordKey(prefix, timer) {
  if (timer.clock !== "event" || !startsWith(timer.key, prefix)) return undefined;
  return timer.key.subarray(prefix.length);
}

/**
 * How many windows one firing of a window end's timer closes at most; it
 * sets a timer for the rest (`name 0x01 last-key`, at the same time), which
 * fire in the host's next round. Below the host's default limit of 100
 * outputs per fired timer.
 */
export const WINDOWS_PER_FIRING = 64;

/**
 * The byte after the name in the key of the timer that goes on with a window
 * end's windows after the last key a firing closed (`name 0x01 key`);
 * distinct from the `name 0x00 key` of per-key timers.
 */
const CONTINUED = 0x01;

function timestampOf(record) {
  const ts = record.timestampBigInt;
  if (ts === undefined) {
    throw new SluiceError(
      `record ${record.topic}-${record.partition}@${record.offset} has no timestamp, so it falls in no event-time window`,
    );
  }
  return ts;
}

/**
 * Tumbling or hopping event-time windows per record key, each with an
 * accumulator (stored as JSON).
 *
 * Each window of a key keeps one accumulator, which `add` folds each record
 * into. Each window *end* has one event-time timer at
 * `end - 1 + allowed lateness`, whatever the number of keys (Flink and Kafka
 * Streams keep one per key and window: here a window's keys cost no timer
 * each, to set, checkpoint, log and fire). When it fires, `fire` in
 * `onTimer` turns it into the closed `Window`s of that end and removes their
 * state, `WINDOWS_PER_FIRING` at a time: each window's result comes out
 * once. Create them with `Windows.tumbling` or `Windows.hopping`; create
 * them once (at module level or in the constructor).
 *
 * Layout (the Rust SDK's): window `start` of record key `k` is the
 * `MapState` entry (`name`, `start` as an i64 map key's 8 bytes, `k` as the
 * map key), that is `name 0x00 00 00 00 08 start k`, so one window's keys
 * are one key range; its timer is the event-time timer with the key `name`.
 * A firing takes the range's first `WINDOWS_PER_FIRING` entries in key
 * order and, if more remain, sets an event-time timer `name 0x01 last-key`
 * at the same time, whose firing goes on after that key. (Earlier SDKs stored
 * (`name`, `k`, `start`) with a timer `name 0x00 k` per key; `fire` still
 * closes such a window.)
 */
export class Windows {
  /**
   * @param {string} name unique among the transform's states and windows.
   * @param {Millis} sizeMs
   * @param {Millis} [slideMs] default: `sizeMs` (tumbling)
   * @param {Millis} [allowedLatenessMs] default 0
   */
  constructor(name, sizeMs, slideMs, allowedLatenessMs = 0) {
    // Per window start (its i64 map key bytes as the record key), the
    // accumulator of each record key (as the map key).
    this.state = new MapState(name, { keyType: MapKey.BYTES });
    // Per record key, the accumulator of each window start: earlier SDKs' layout.
    this.perKey = new MapState(name, { keyType: MapKey.I64 });
    this.name = name;
    this.size = toMillis(`windows \`${name}\`: the size`, sizeMs);
    this.slide = slideMs === undefined ? this.size : toMillis(`windows \`${name}\`: the slide`, slideMs);
    this.lateness = toMillis(`windows \`${name}\`: the allowed lateness`, allowedLatenessMs);
    if (this.size <= 0n || this.slide <= 0n || this.slide > this.size) {
      throw new SluiceError(`windows \`${name}\`: the size and slide must be positive, and the slide at most the size`);
    }
    this.timerPrefix = concatBytes(this.state.nameBytes, new Uint8Array([0]));
  }

  /** Windows `[k * size, (k + 1) * size)` named `name`. @param {string} name @param {Millis} sizeMs */
  static tumbling(name, sizeMs) {
    return new Windows(name, sizeMs);
  }

  /**
   * Windows of `sizeMs` starting every `slideMs`: a record falls in
   * `size / slide` of them (rounded up).
   * @param {string} name @param {Millis} sizeMs @param {Millis} slideMs
   */
  static hopping(name, sizeMs, slideMs) {
    return new Windows(name, sizeMs, slideMs);
  }

  /**
   * The same windows, staying open `ms` after the watermark passes their end
   * (default 0) for late records; each still fires once.
   * @param {Millis} ms
   */
  allowedLateness(ms) {
    return new Windows(this.name, this.size, this.slide, ms);
  }

  /** @returns {number} */
  get sizeMs() {
    return Number(this.size);
  }

  /** @returns {number} */
  get slideMs() {
    return Number(this.slide);
  }

  /** @returns {number} */
  get latenessMs() {
    return Number(this.lateness);
  }

  firesAt(start) {
    return sat(sat(sat(start + this.size) - 1n) + this.lateness);
  }

  /** The start of the window whose timer is set for `at`. */
  startOf(at) {
    return sat(sat(sat(at - this.lateness) + 1n) - this.size);
  }

  /**
   * The first bytes of every accumulator of the window starting at `start`:
   * `name 0x00 u32-be(8) i64-key(start)`, so that one window's accumulators
   * are the entries of one key range.
   */
  windowPrefix(start) {
    return this.state.prefix(MapKey.I64.encode(start));
  }

  /**
   * Folds a record at `timestamp` of `key` into every open window that holds
   * it (`fold` gets the window's accumulator, `undefined` for a new one, and
   * returns the new one); returns how many took it: 0 when all of them have
   * fired already (the record is too late for them).
   * @param {Bytes} key
   * @param {Millis} timestamp
   * @param {(acc: any) => any} fold
   * @returns {number}
   */
  add(key, timestamp, fold) {
    const k = toBytes(key);
    const ts = toI64("timestamp", timestamp);
    const w = watermarkExact();
    let start = sat(divEuclid(ts, this.slide) * this.slide);
    const floor = sat(ts - this.size);
    let added = 0;
    while (start > floor) {
      const firesAt = this.firesAt(start);
      if (w === undefined || firesAt > w) {
        const windowKey = MapKey.I64.encode(start);
        const old = this.state.get(windowKey, k);
        this.state.set(windowKey, k, fold(old));
        // One timer per window end, whatever the keys: set with a window's
        // first accumulator (once per call), and firing it closes every
        // key's window of that start.
        if (old === undefined || old === null) {
          setOncePerCall(new Timer("event", this.state.nameBytes, firesAt));
        }
        added++;
      }
      start = sat(start - this.slide);
    }
    return added;
  }

  /**
   * `add` for a record: its key (`keyOrEmpty()`) and its timestamp (an error
   * if it has none).
   * @param {Record} record @param {(acc: any) => any} fold @returns {number}
   */
  addRecord(record, fold) {
    return this.add(record.keyOrEmpty(), timestampOf(record), fold);
  }

  /**
   * If `timer` is one of these windows' timers, the windows it closes, whose
   * state is removed, in key byte order: at most `WINDOWS_PER_FIRING`; the
   * rest come from a timer this sets at the same time (`name 0x01
   * last-key`), in the host's next round. Empty for any other timer (another
   * window's, or one the transform set itself).
   * @param {Timer} timer @returns {Window[]}
   */
  fire(timer) {
    const t = Timer.fromWit(timer);
    if (t.clock !== "event") return [];
    // The window end's timer, or the one that goes on after the key the
    // previous firing of that end stopped at.
    const name = this.state.nameBytes;
    if (!startsWith(t.key, name)) return this.fireStoredPerKey(t);
    let last;
    if (t.key.length === name.length) last = undefined;
    else if (t.key[name.length] === CONTINUED) last = t.key.subarray(name.length + 1);
    else return this.fireStoredPerKey(t);
    const start = this.startOf(t.atBigInt);
    const end = sat(start + this.size);
    const prefix = this.windowPrefix(start);
    // From after the last key fired, not from the range's start: the windows
    // fired before are deletions there until the checkpoint folds them, and
    // passing over them again, page after page, would cost a window end with
    // n keys O(n^2 / 64).
    const after = last === undefined ? undefined : concatBytes(prefix, last);
    const page = store.scan(prefix, after, WINDOWS_PER_FIRING + 1);
    const closed = [];
    for (const [entry, raw] of page.slice(0, WINDOWS_PER_FIRING)) {
      if (!startsWith(entry, prefix)) {
        throw new SluiceError(`host bug: state.scan-prefix returned a key outside the prefix (windows \`${this.name}\`)`);
      }
      closed.push(new Window(Uint8Array.from(entry.subarray(prefix.length)), start, end, jsonDecode(this.name, raw)));
      store.writeKey(entry, undefined);
    }
    if (page.length > WINDOWS_PER_FIRING && closed.length > 0) {
      const key = concatBytes(concatBytes(name, new Uint8Array([CONTINUED])), closed[closed.length - 1].key);
      new Timer("event", key, t.atBigInt).set();
    }
    return closed;
  }

  /**
   * A timer `name 0x00 key` of a window that an earlier SDK stored per key
   * (`name`, key, start): closes that window alone, so that windows open
   * across an upgrade are not lost.
   * @param {Timer} t @returns {Window[]}
   */
  fireStoredPerKey(t) {
    const key = timerRecordKey(this.timerPrefix, t);
    if (key === undefined) return [];
    const start = this.startOf(t.atBigInt);
    const value = this.perKey.get(key, start);
    if (value === undefined) return [];
    this.perKey.remove(key, start);
    return [new Window(Uint8Array.from(key), start, sat(start + this.size), value)];
  }
}

/**
 * Session windows per record key: records less than `gapMs` apart form one
 * session `[first, last + gap)`, closed when the watermark passes its end
 * (plus the allowed lateness); a record that bridges two sessions merges
 * them.
 *
 * A key's open sessions are one `ValueState` JSON array of
 * `{"start", "end", "value"}`; each session has an event-time timer with the
 * key `name 0x00 key` at `end - 1 + allowed lateness`.
 */
export class SessionWindows {
  /**
   * @param {string} name unique among the transform's states and windows.
   * @param {Millis} gapMs
   * @param {Millis} [allowedLatenessMs] default 0
   */
  constructor(name, gapMs, allowedLatenessMs = 0) {
    this.state = new ValueState(name);
    this.name = name;
    this.gap = toMillis(`sessions \`${name}\`: the gap`, gapMs);
    this.lateness = toMillis(`sessions \`${name}\`: the allowed lateness`, allowedLatenessMs);
    if (this.gap <= 0n) throw new SluiceError(`sessions \`${name}\`: the gap must be positive`);
    this.timerPrefix = this.state.prefix;
  }

  /** The same sessions, staying open `ms` after the watermark passes their end. @param {Millis} ms */
  allowedLateness(ms) {
    return new SessionWindows(this.name, this.gap, ms);
  }

  /** @returns {number} */
  get gapMs() {
    return Number(this.gap);
  }

  /** @returns {number} */
  get latenessMs() {
    return Number(this.lateness);
  }

  firesAt(end) {
    return sat(sat(end - 1n) + this.lateness);
  }

  /** The open sessions of record key `k` (bytes), with BigInt bounds. */
  sessions(k) {
    const raw = store.read(this.state.prefixKey + mapKey(k), this.state, k);
    if (raw === undefined) return [];
    const list = jsonDecode(this.name, raw);
    const bad = () =>
      new SluiceError(`state \`${this.name}\`: invalid JSON: expected an array of {"start", "end", "value"}`);
    if (!Array.isArray(list)) throw bad();
    return list.map((s) => {
      if (s === null || typeof s !== "object" || !Number.isInteger(s.start) || !Number.isInteger(s.end) || !("value" in s)) {
        throw bad();
      }
      // Exact up to 2^53; a saturated bound (written exactly) reads back exactly.
      return { start: sat(BigInt(s.start)), end: sat(BigInt(s.end)), value: s.value };
    });
  }

  store(k, sessions) {
    const mk = this.state.prefixKey + mapKey(k);
    if (sessions.length === 0) {
      store.write(mk, this.state, k, undefined);
      return;
    }
    // As serde writes the Rust struct: start, end, value; the bounds exactly.
    const text = `[${sessions
      .map((s) => `{"start":${s.start},"end":${s.end},"value":${jsonEncode(this.name, s.value)}}`)
      .join(",")}]`;
    store.write(mk, this.state, k, encoder.encode(text));
  }

  /**
   * Folds a record at `timestamp` of `key` into its session: a new one
   * (`fold(undefined)`), the one it extends, or (when it bridges several)
   * their merge, combined pairwise with `merge(a, b)`. Returns false if the
   * session it would open has fired already (the record is too late).
   * @param {Bytes} key
   * @param {Millis} timestamp
   * @param {(acc: any) => any} fold
   * @param {(a: any, b: any) => any} merge
   * @returns {boolean}
   */
  add(key, timestamp, fold, merge) {
    const k = toBytes(key);
    const start = toI64("timestamp", timestamp);
    const end = sat(start + this.gap);
    const w = watermarkExact();
    if (w !== undefined && this.firesAt(end) <= w) return false;
    const touching = [];
    const rest = [];
    for (const s of this.sessions(k)) (s.start < end && start < s.end ? touching : rest).push(s);
    const timerKey = concatBytes(this.timerPrefix, k);
    let merged;
    for (const s of touching) {
      new Timer("event", timerKey, this.firesAt(s.end)).delete();
      merged =
        merged === undefined
          ? s
          : {
              start: merged.start < s.start ? merged.start : s.start,
              end: merged.end > s.end ? merged.end : s.end,
              value: merge(merged.value, s.value),
            };
    }
    const session =
      merged === undefined
        ? { start, end, value: fold(undefined) }
        : {
            start: merged.start < start ? merged.start : start,
            end: merged.end > end ? merged.end : end,
            value: fold(merged.value),
          };
    new Timer("event", timerKey, this.firesAt(session.end)).set();
    rest.push(session);
    rest.sort((a, b) => (a.start < b.start ? -1 : a.start > b.start ? 1 : 0));
    this.store(k, rest);
    return true;
  }

  /**
   * `add` for a record: its key (`keyOrEmpty()`) and its timestamp (an error
   * if it has none).
   * @param {Record} record @param {(acc: any) => any} fold @param {(a: any, b: any) => any} merge
   * @returns {boolean}
   */
  addRecord(record, fold, merge) {
    return this.add(record.keyOrEmpty(), timestampOf(record), fold, merge);
  }

  /**
   * If `timer` is one of these sessions' timers, the session it closes,
   * whose state is removed; `null` for any other timer.
   * @param {Timer} timer @returns {Window | null}
   */
  fire(timer) {
    const t = Timer.fromWit(timer);
    const key = timerRecordKey(this.timerPrefix, t);
    if (key === undefined) return null;
    const closed = [];
    const open = [];
    for (const s of this.sessions(key)) (this.firesAt(s.end) === t.atBigInt ? closed : open).push(s);
    if (closed.length === 0) return null;
    this.store(key, open);
    const s = closed[0];
    return new Window(Uint8Array.from(key), s.start, s.end, s.value);
  }
}

// ------------------------------------------------------------------ logging

function format(args) {
  return args
    .map((a) => {
      if (typeof a === "string") return a;
      if (a instanceof Error) return a.stack ? `${a}\n${a.stack}` : String(a);
      try {
        const s = JSON.stringify(a, (_, v) => (typeof v === "bigint" ? v.toString() : v));
        return s === undefined ? String(a) : s;
      } catch {
        return String(a);
      }
    })
    .join(" ");
}

/**
 * Lines in the host's log; each call is one boundary crossing, so keep them
 * off the per-record path. Arguments are joined like `console.log` does.
 */
export const log = {
  trace: (...args) => hostLog("trace", format(args)),
  debug: (...args) => hostLog("debug", format(args)),
  info: (...args) => hostLog("info", format(args)),
  warn: (...args) => hostLog("warn", format(args)),
  error: (...args) => hostLog("error", format(args)),
};

// The component is built without WASI stdio, so console output would vanish:
// send it to the host's log instead.
for (const [method, level] of [
  ["log", "info"],
  ["info", "info"],
  ["debug", "debug"],
  ["trace", "trace"],
  ["warn", "warn"],
  ["error", "error"],
]) {
  globalThis.console[method] = log[level];
}

// ---------------------------------------------------------------- transform

/**
 * Base class of a transform; `process` is required. The instance is created
 * once per guest instance with the job's `Config` (a throw fails the job).
 * Fields must not hold anything a replay would need: keep that in state.
 */
export class Transform {
  /** @param {Config} config */
  constructor(config) {}

  /** Before the batch's first record: the place to `prefetch`. @param {Batch} batch */
  beginBatch(batch) {}

  /** Transforms one record, emitting any number of outputs. @param {Record} record @param {Emitter} out */
  process(record, out) {
    throw new SluiceError("process is not implemented");
  }

  /** After the batch's last record, before state is written back. @param {Emitter} out */
  endBatch(out) {}

  /**
   * Called for each due timer of the shard, in time order: an event-time
   * timer once the watermark reaches its time, a processing-time one once
   * the host's clock does. The timer is already removed; set it again to fire
   * again. State is written back after the call's last timer, as for a
   * batch; a throw fails the call (the host restarts the task from its last
   * checkpoint and the timers fire again). Time-to-live timers never get
   * here. Does nothing by default.
   * @param {Timer} timer @param {Emitter} out
   */
  onTimer(timer, out) {}

  /**
   * Called once per shard after the job was upgraded to this module, after
   * the constructor and before the first batch, with the sha256 (hex) of the
   * module that wrote the state: the place to rewrite old state in this
   * module's layout. Its writes are part of the next checkpoint; if the task
   * restarts before that commits, it runs again over the old state. Keeps
   * the state as it is by default.
   * @param {string} fromModule
   */
  migrate(fromModule) {}
}

function message(e) {
  if (e instanceof SluiceError) return e.message;
  if (e instanceof Error) return `${e.name}: ${e.message}`;
  return String(e);
}

/**
 * Makes `cls` (a `Transform` subclass) the component's implementation of
 * world `timed`:
 * `export const { init, process, migrate, onTimers } = exportTransform(MyTransform);`
 */
export function exportTransform(cls) {
  let instance;

  // The instance for the export `name` (of `shard`'s batch, whose state the
  // store may hold), with a new call's time.
  const begin = (name, shard) => {
    if (instance === undefined) throw `${name} called before init`;
    store.begin(shard);
    newCall();
    return instance;
  };

  return {
    init(config) {
      store.discard();
      newCall();
      try {
        const t = new cls(new Config(config));
        store.finish(); // state touched in the constructor: the host refuses it (state belongs to an input partition)
        instance = t;
      } catch (e) {
        store.discard();
        throw message(e);
      }
    },

    process(batch, shard) {
      const t = begin("process", shard);
      const wrapped = new Array(batch.length);
      for (let i = 0; i < batch.length; i++) wrapped[i] = new Record(batch[i]);
      const records = new Batch(wrapped);
      const out = new Emitter();
      let stage = "begin_batch";
      try {
        t.beginBatch(records);
        const list = records.records;
        for (let i = 0; i < list.length; i++) {
          stage = list[i];
          t.process(stage, out);
        }
        stage = "end_batch";
        t.endBatch(out);
        stage = undefined;
        store.end();
      } catch (e) {
        store.discard();
        if (stage instanceof Record) stage = `record ${stage.topic}-${stage.partition}@${stage.offset}`;
        throw stage ? `${stage}: ${message(e)}` : message(e);
      }
      return out.records;
    },

    onTimers(fired) {
      const t = begin("on-timers");
      const out = new Emitter();
      let timer;
      try {
        for (const w of fired) {
          const this_ = Timer.fromWit(w);
          if (expire(this_)) continue; // the SDK's own time-to-live timers
          timer = this_;
          t.onTimer(this_, out);
          timer = undefined;
        }
        store.finish();
      } catch (e) {
        store.discard();
        const msg = message(e);
        throw timer ? `timer ${CLOCK_NAMES[timer.clock]} ${debugStr(timer.key)}@${timer.atBigInt}: ${msg}` : msg;
      }
      return out.records;
    },

    migrate(fromModule) {
      const t = begin("migrate");
      try {
        t.migrate(fromModule);
        store.finish();
      } catch (e) {
        store.discard();
        throw message(e);
      }
    },
  };
}

/**
 * The SDK's internals, for `sluice-guest/testing` (the simulated host). Not a
 * stable API.
 * @private
 */
export const __internals = { CACHE_BYTES, newCall, store, expire, appendJson, parseDurationMs, unpackBatch, packOutputs };
