// A simulated host for unit tests under Node (the counterpart of the Rust
// SDK's `time::testing` and the Python SDK's `sluice.testing`): set the
// watermark and the clock, take the timers that are due as the host would
// fire them, look at or reset the in-memory state store, and run a
// transform over `sluice exec`'s JSON lines.
//
// It needs the module hooks (`node --import sluice-guest/register ...`),
// which point the SDK's WIT imports at the in-memory host (testing/host.js).
// Drive a transform as the host does:
//
//     import * as testing from "sluice-guest/testing";
//     import * as app from "./app.js";          // exportTransform's exports
//
//     app.init([]);
//     app.process(records);                     // WIT input-record shapes
//     testing.setWatermark(60_000);
//     const outputs = app.onTimers(testing.takeDue());

import * as host from "./testing/host.js";
import { Timer, __internals } from "./sluice.js";

const sdk = __internals;

/** A time as the host keeps it: an s64 BigInt (numbers must be whole). */
function i64(at) {
  if (typeof at === "bigint") return at;
  if (!Number.isInteger(at)) throw new TypeError(`time must be a whole number of ms, not ${at}`);
  const max = (1n << 63n) - 1n;
  const b = BigInt(at);
  return b > max ? max : b < -max - 1n ? -max - 1n : b;
}

/**
 * Sets the watermark (`undefined`: none yet; tests may move it back, the
 * host never does) and starts a new call (the cached watermark and clock, and
 * the timers windows have set in the call, are forgotten).
 * @param {number | bigint | undefined} at
 */
export function setWatermark(at) {
  host.time.watermark = at === undefined || at === null ? undefined : i64(at);
  sdk.newCall();
}

/** Sets the host's clock and starts a new call. @param {number | bigint} at */
export function setProcessingTime(at) {
  host.time.now = i64(at);
  sdk.newCall();
}

const toTimer = (t) => new Timer(t.clock, t.key, t.at);

/**
 * Removes and returns the due timers, in the order the host fires them:
 * event-time timers at or below the watermark, then processing-time timers
 * at or below the clock, each by time, then key.
 * @returns {Timer[]}
 */
export function takeDue() {
  const { watermark, now } = host.time;
  const due = host
    .sortedTimers()
    .filter(([, t]) => (t.clock === "event" ? watermark !== undefined && t.at <= watermark : t.at <= now));
  for (const [id] of due) host.time.timers.delete(id);
  return due.map(([, t]) => toTimer(t));
}

/** @returns {Timer[]} the timers set, in order. */
export function pending() {
  return host.sortedTimers().map(([, t]) => toTimer(t));
}

/** Forgets every timer and resets the watermark (none) and the clock (0). */
export function reset() {
  host.resetTime();
  sdk.newCall();
}

/** Empties the in-memory state store, the SDK's cache (holding nothing, as before `hold-state`), the call counts and the log. */
export function resetState() {
  sdk.store.discard();
  sdk.store.hold(0);
  host.resetState();
}

/** Ends a call as the SDK does after a batch: writes the cached state changes back and empties the cache. */
export function finish() {
  sdk.store.finish();
}

/**
 * The store's entries as the host holds them (written-back state only: call
 * `finish` first), sorted by key.
 * @returns {Array<[Uint8Array, Uint8Array]>}
 */
export function state() {
  return [...host.map.entries()].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)).map(([, kv]) => kv);
}

/**
 * How many calls a host would have seen so far, by function (`get`,
 * `getMany`, `write`, `scanPrefix`, `watermark`, `processingTime`,
 * `setTimer`, `deleteTimer`, ...).
 */
export function calls() {
  return { ...host.calls };
}

/** @returns {Array<[string, string]>} the log lines so far, as `[level, message]`. */
export function logLines() {
  return host.lines.slice();
}

/**
 * If `timer` is one of the SDK's own time-to-live timers, handles it as
 * `onTimers` does (deleting its entry if it has expired) and returns true.
 * @param {Timer} timer
 */
export function expire(timer) {
  return sdk.expire(timer);
}

const enc = new TextEncoder();
const dec = new TextDecoder();

/** One WIT input-record from a `sluice exec` input line (an object or its JSON text). */
export function inputRecord(line, offset, { topic = "input", partition = 0 } = {}) {
  const j = typeof line === "string" ? JSON.parse(line) : line;
  const bytes = (v) => (v == null ? undefined : enc.encode(typeof v === "string" ? v : JSON.stringify(v)));
  return {
    key: bytes(j.key),
    value: bytes(j.value),
    headers: [],
    timestamp: j.timestamp == null ? undefined : i64(j.timestamp),
    topic: j.topic ?? topic,
    partition: j.partition ?? partition,
    offset: BigInt(j.offset ?? offset),
  };
}

/** An output record as a `sluice exec` output line (UTF-8 keys and values). */
export function outputLine(r) {
  const o = {};
  if (r.key !== undefined) o.key = dec.decode(r.key);
  o.value = r.value === undefined ? null : dec.decode(r.value);
  if (r.topic !== undefined) o.topic = r.topic;
  return JSON.stringify(o);
}

/**
 * Runs an exported transform (`{ init, process, onTimers }`) over `sluice
 * exec` input lines as `sluice exec` does with one input partition and no
 * out-of-orderness: batches of `batchSize` records, the watermark at the
 * largest timestamp seen, `{"watermark": ...}` and `{"processing_time": ...}`
 * lines, and due timers fired after each batch and each such line. Starts
 * from an empty store and clock. Returns the output lines.
 *
 * @param {{ init: Function, process: Function, onTimers?: Function }} world
 * @param {string} input JSON lines
 * @param {{ batchSize?: number, config?: Array<[string, string]> }} [options]
 * @returns {string[]}
 */
export function exec(world, input, { batchSize = 1000, config = [] } = {}) {
  resetState();
  reset();
  world.init(config);
  const out = [];
  let batch = [];
  let index = 0;
  let wm;
  let clock = 0n;

  const fire = () => {
    for (let i = 0; i < 1000; i++) {
      const due = takeDue();
      if (due.length === 0) return;
      out.push(...world.onTimers(due.map((t) => t.toWit())).map(outputLine));
    }
    throw new Error("timers keep firing");
  };
  const advance = (at) => {
    wm = wm === undefined || at > wm ? at : wm;
    setWatermark(wm);
  };
  const flush = () => {
    out.push(...world.process(batch).map(outputLine));
    for (const r of batch) if (r.timestamp !== undefined) advance(r.timestamp);
    batch = [];
    fire();
  };

  for (const line of input.split("\n")) {
    if (!line.trim()) continue;
    const j = JSON.parse(line);
    if ("watermark" in j || "processing_time" in j) {
      if (batch.length > 0) flush();
      // JSON.parse rounds i64::MAX to 2^63, which saturates back to it.
      if ("processing_time" in j) {
        const t = i64(j.processing_time);
        clock = t > clock ? t : clock;
        setProcessingTime(clock);
      }
      if ("watermark" in j) advance(i64(j.watermark));
      fire();
      continue;
    }
    batch.push(inputRecord(j, index++));
    if (batch.length === batchSize) flush();
  }
  if (batch.length > 0) flush();
  return out;
}
