// Write sluice transforms in JavaScript.
//
// A sluice transform is a WebAssembly component (world
// `sluice:transform/transform`, wit/sluice.wit) that the host feeds batches of
// Kafka records; it returns the records to write and keeps keyed state that
// the host checkpoints exactly once. This module is the JavaScript
// counterpart of the Rust crate `sluice-guest`: it hides the raw
// componentize-js bindings behind a small API.
//
// - `Transform`: extend it (`constructor(config)`, `beginBatch`, `process`,
//   `endBatch`), then `export const { init, process } = exportTransform(MyTransform);`
// - `Record` and `Batch` to read input, `Emitter` to write.
// - `Config` for the job's settings.
// - `ValueState`: one JSON value per record key, cached per batch.
// - `SluiceError`: throw it to fail the batch with a plain message.
// - `log.info(...)` and friends into the host's log; `console.log` and
//   friends are redirected there too.
//
// Example, a running count per key:
//
//     import { Transform, ValueState, exportTransform } from "./sluice.js";
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
//     export const { init, process } = exportTransform(RunningCount);
//
// Batch lifecycle (as in the Rust SDK): for every batch, `beginBatch`, then
// `process` for each record in input order, then `endBatch`; then all state
// changes of the batch go to the host with one `state.write` and the emitted
// records are returned. Anything thrown fails the whole batch: outputs and
// unflushed state writes are dropped and the host replays the batch from the
// last checkpoint. A throw never traps the instance; its message becomes the
// batch's error (`record <topic>-<partition>@<offset>: <message>` when thrown
// from `process`; a `SluiceError` gives its message alone, another `Error`
// `<name>: <message>`).
//
// State and key layout: identical to the Rust SDK, so a job can switch
// language and keep its state. A `ValueState` named `name` stores the value
// for record key `k` under host key `name 0x00 k` (`k` as bytes; a string key
// is UTF-8), as JSON text (`JSON.stringify`, which is also what serde_json
// writes for integers, strings, arrays and objects). A write-back cache sits in
// front of the host for the length of one batch: reads hit the host at most
// once per key (`prefetch` loads many keys with one `state.get-many`), writes
// stay in the guest until the batch ends, and nothing is cached across
// batches because the host may roll state back between them.
//
// Bytes are `Uint8Array`s. JSON numbers are JS numbers, exact up to 2^53.

// componentize-js resolves only the WIT package's exact version; build.sh
// rewrites these specifiers to the version in wit/sluice.wit.
import * as hostState from "sluice:transform/state@0.1.1";
import { log as hostLog } from "sluice:transform/log@0.1.1";

const encoder = new TextEncoder();
const decoder = new TextDecoder("utf-8", { fatal: true });
const EMPTY = new Uint8Array(0);

/** @typedef {Uint8Array | string} Bytes  A string is encoded as UTF-8. */

/** @param {Bytes} b @returns {Uint8Array} */
function toBytes(b) {
  if (b instanceof Uint8Array) return b;
  if (typeof b === "string") return encoder.encode(b);
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

/** A failure whose message is reported as is (no error-name prefix). */
export class SluiceError extends Error {
  constructor(message) {
    super(message);
    this.name = "SluiceError";
  }
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
    return this.r.timestamp === undefined ? undefined : Number(this.r.timestamp);
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
    return this.records.map((r) => r.keyOrEmpty());
  }

  get length() {
    return this.records.length;
  }

  [Symbol.iterator]() {
    return this.records[Symbol.iterator]();
  }
}

/** Collects a batch's output records; emitting never crosses into the host. */
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

  /** Like `emit`, with the value encoded as JSON. */
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

// The per-batch write-back cache in front of the host's `state`. `entries`
// holds every key read or written during the batch: { key, value, dirty }
// (value `undefined`: absent or deleted), under `mk`, the host key as a
// one-char-per-byte string. Callers pass the state and the record key, so the
// host key's bytes are only built on a miss.
class Store {
  constructor(backend) {
    this.backend = backend;
    this.entries = new Map();
    this.dirty = 0;
  }

  read(mk, state, k) {
    const slot = this.entries.get(mk);
    if (slot !== undefined) return slot.value;
    const key = state.key(k);
    const value = this.backend.get(key);
    this.entries.set(mk, { key, value, dirty: false });
    return value;
  }

  prefetch(state, pairs) {
    const missing = new Map();
    for (const [mk, k] of pairs) if (!this.entries.has(mk) && !missing.has(mk)) missing.set(mk, state.key(k));
    if (missing.size === 0) return;
    const keys = [...missing.values()];
    const values = this.backend.getMany(keys);
    if (values.length !== keys.length) {
      throw new SluiceError(`host bug: state.get-many returned ${values.length} values for ${keys.length} keys`);
    }
    let i = 0;
    for (const [mk, key] of missing) this.entries.set(mk, { key, value: values[i++], dirty: false });
  }

  write(mk, state, k, value) {
    const slot = this.entries.get(mk);
    if (slot === undefined) {
      this.entries.set(mk, { key: state.key(k), value, dirty: true });
      this.dirty++;
    } else {
      if (!slot.dirty) {
        if (sameBytes(slot.value, value)) return; // the host already has exactly this
        slot.dirty = true;
        this.dirty++;
      }
      slot.value = value;
    }
  }

  // Ends a batch: one `state.write` with every dirty entry, then forgets all.
  finish() {
    if (this.dirty > 0) {
      const writes = [];
      for (const slot of this.entries.values()) if (slot.dirty) writes.push([slot.key, slot.value]);
      this.entries = new Map();
      this.dirty = 0;
      this.backend.write(writes);
    } else {
      this.entries.clear();
    }
  }

  // Ends a failed batch: drops the cache and its unflushed writes.
  discard() {
    this.entries = new Map();
    this.dirty = 0;
  }
}

const store = new Store(hostState);

/**
 * One JSON value per record key, stored under `name 0x00 key`.
 *
 * Create it once at module level (it is only a name). Keys are `Uint8Array`s
 * or strings (UTF-8); values anything `JSON.stringify` encodes. Every call
 * goes through the per-batch cache, so only `prefetch` and cache misses cross
 * into the host.
 */
export class ValueState {
  /** @param {string} name non-empty, no NUL character, unique among the states. */
  constructor(name) {
    if (typeof name !== "string" || name.length === 0) throw new SluiceError("state name must not be empty");
    if (name.includes("\0")) throw new SluiceError(`state name "${name.replace(/\0/g, "\\0")}" must not contain a 0x00 byte`);
    this.name = name;
    const n = encoder.encode(name);
    this.prefix = new Uint8Array(n.length + 1);
    this.prefix.set(n);
    this.prefixKey = mapKey(this.prefix);
  }

  /** @param {Bytes} key @returns {Uint8Array} the host key: `name 0x00 key`. */
  key(key) {
    const k = toBytes(key);
    const out = new Uint8Array(this.prefix.length + k.length);
    out.set(this.prefix);
    out.set(k, this.prefix.length);
    return out;
  }

  decode(raw) {
    if (raw === undefined) return undefined;
    try {
      return JSON.parse(decoder.decode(raw));
    } catch (e) {
      throw new SluiceError(`state \`${this.name}\`: invalid JSON: ${e.message}`);
    }
  }

  encode(value) {
    const text = JSON.stringify(value);
    if (text === undefined) throw new SluiceError(`state \`${this.name}\`: value cannot be encoded as JSON`);
    return encoder.encode(text);
  }

  /** @returns {any} the value for `key`, or `undefined` when there is none. */
  get(key) {
    const k = toBytes(key);
    return this.decode(store.read(this.prefixKey + mapKey(k), this, k));
  }

  /** Stores `value` for `key`. */
  set(key, value) {
    const k = toBytes(key);
    store.write(this.prefixKey + mapKey(k), this, k, this.encode(value));
  }

  /**
   * Replaces the value for `key` with `f(current)` (`current` is `undefined`
   * when absent) and returns the new value.
   */
  update(key, f) {
    const k = toBytes(key);
    const mk = this.prefixKey + mapKey(k);
    const next = f(this.decode(store.read(mk, this, k)));
    store.write(mk, this, k, this.encode(next));
    return next;
  }

  /** Removes the value for `key`. */
  clear(key) {
    const k = toBytes(key);
    store.write(this.prefixKey + mapKey(k), this, k, undefined);
  }

  /**
   * Loads the values of all `keys` into the batch's cache with one
   * `state.get-many`; call it from `beginBatch` with `batch.keys()`.
   * @param {Iterable<Bytes>} keys
   */
  prefetch(keys) {
    const pairs = [];
    for (const key of keys) {
      const k = toBytes(key);
      pairs.push([this.prefixKey + mapKey(k), k]);
    }
    store.prefetch(this, pairs);
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

  /** Transforms one record, emitting any number of outputs. */
  process(record, out) {
    throw new SluiceError("process is not implemented");
  }

  /** After the batch's last record, before state is written back. @param {Emitter} out */
  endBatch(out) {}
}

function message(e) {
  if (e instanceof SluiceError) return e.message;
  if (e instanceof Error) return `${e.name}: ${e.message}`;
  return String(e);
}

/**
 * Makes `cls` (a `Transform` subclass) the component's implementation:
 * `export const { init, process } = exportTransform(MyTransform);`
 */
export function exportTransform(cls) {
  let instance;
  return {
    init(config) {
      store.discard();
      try {
        const t = new cls(new Config(config));
        store.finish(); // state touched in the constructor: the host refuses it (state belongs to an input partition)
        instance = t;
      } catch (e) {
        store.discard();
        throw message(e);
      }
    },

    process(batch) {
      const t = instance;
      if (t === undefined) throw "process called before init";
      const records = new Batch(batch.map((r) => new Record(r)));
      const out = new Emitter();
      store.discard();
      let stage = "begin_batch";
      try {
        t.beginBatch(records);
        for (const r of records.records) {
          stage = r;
          t.process(r, out);
        }
        stage = "end_batch";
        t.endBatch(out);
        stage = undefined;
        store.finish();
      } catch (e) {
        store.discard();
        if (stage instanceof Record) stage = `record ${stage.topic}-${stage.partition}@${stage.offset}`;
        throw stage ? `${stage}: ${message(e)}` : message(e);
      }
      return out.records;
    },
  };
}
