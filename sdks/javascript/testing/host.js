// In-memory stand-ins for the host's `state`, `log` and `time` interfaces,
// with the same shapes as the componentize-js bindings (bytes are
// Uint8Arrays, `none` is undefined, `s64` a BigInt, the clock "event" or
// "processing") and a count of the calls a host would have seen. The module
// hooks (hooks.js) resolve every `sluice:transform/...` import to this
// module outside a component; `sluice-guest/testing` drives it.

const hex = (b) => Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");

/** host key (hex) -> [key bytes, value bytes] */
export const map = new Map();
export const calls = {
  get: 0,
  getMany: 0,
  set: 0,
  delete: 0,
  write: 0,
  scanPrefix: 0,
  watermark: 0,
  processingTime: 0,
  setTimer: 0,
  deleteTimer: 0,
};
export const lines = [];
/** The simulated clock and timers: timer id -> { clock, key, at }. */
export const time = { watermark: undefined, now: 0n, timers: new Map() };

/** Empties the state, the call counts and the log. */
export function resetState() {
  map.clear();
  for (const k of Object.keys(calls)) calls[k] = 0;
  lines.length = 0;
}

/** Forgets every timer and resets the watermark (none) and the clock (0). */
export function resetTime() {
  time.watermark = undefined;
  time.now = 0n;
  time.timers.clear();
}

// -- state

export function get(key) {
  calls.get++;
  return map.get(hex(key))?.[1];
}

export function getMany(keys) {
  calls.getMany++;
  return keys.map((k) => map.get(hex(k))?.[1]);
}

// The packed forms (wit/sluice.wit), decoded here on their own, so the tests
// check the SDK's packing against the layout; counted as the calls they
// stand for.
export function getManyPacked(packed) {
  const view = new DataView(packed.buffer, packed.byteOffset, packed.byteLength);
  const keys = [];
  let at = 4;
  for (let i = view.getUint32(0, true); i > 0; i--) {
    const n = view.getUint32(at, true);
    keys.push(packed.slice(at + 4, at + 4 + n));
    at += 4 + n;
  }
  if (at !== packed.length) throw new Error(`get-many-packed: ${packed.length - at} bytes after the last key`);
  const values = getMany(keys);
  const parts = [u32(values.length)];
  for (const v of values) parts.push(v === undefined ? [0] : [1, ...u32(v.length), ...v]);
  return Uint8Array.from(parts.flat());
}

export function writePacked(packed) {
  const view = new DataView(packed.buffer, packed.byteOffset, packed.byteLength);
  const entries = [];
  let at = 4;
  for (let i = view.getUint32(0, true); i > 0; i--) {
    const n = view.getUint32(at, true);
    const key = packed.slice(at + 4, at + 4 + n);
    at += 4 + n;
    if (packed[at] === 0) {
      entries.push([key, undefined]);
      at += 1;
    } else if (packed[at] === 1) {
      const m = view.getUint32(at + 1, true);
      entries.push([key, packed.slice(at + 5, at + 5 + m)]);
      at += 5 + m;
    } else {
      throw new Error(`write-packed: byte ${packed[at]} at ${at} is neither 0 nor 1`);
    }
  }
  if (at !== packed.length) throw new Error(`write-packed: ${packed.length - at} bytes after the last entry`);
  write(entries);
}

function u32(n) {
  return [n & 0xff, (n >>> 8) & 0xff, (n >>> 16) & 0xff, n >>> 24];
}

export function set(key, value) {
  calls.set++;
  map.set(hex(key), [Uint8Array.from(key), Uint8Array.from(value)]);
}

// `delete` is a reserved word: exported under its WIT name.
function remove(key) {
  calls.delete++;
  map.delete(hex(key));
}
export { remove as delete };

export function write(entries) {
  calls.write++;
  for (const [k, v] of entries) {
    if (v === undefined || v === null) map.delete(hex(k));
    else map.set(hex(k), [Uint8Array.from(k), Uint8Array.from(v)]);
  }
}

export function scanPrefix(prefix, startAfter, limit) {
  calls.scanPrefix++;
  const p = hex(prefix);
  const after = startAfter == null ? undefined : hex(startAfter);
  // Hex of bytes sorts as the bytes do.
  return [...map.entries()]
    .filter(([k]) => k.startsWith(p) && (after === undefined || after < p || k > after))
    .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))
    .slice(0, limit)
    .map(([, [k, v]]) => [Uint8Array.from(k), Uint8Array.from(v)]);
}

// -- log

export function log(level, message) {
  lines.push([level, message]);
}

// -- time

const timerId = (t) => `${t.clock === "event" ? 0 : 1} ${String(BigInt(t.at) - (-(1n << 63n))).padStart(20, "0")} ${hex(t.key)}`;

export function watermark() {
  calls.watermark++;
  return time.watermark;
}

export function processingTime() {
  calls.processingTime++;
  return time.now;
}

function checkTimer(t) {
  if (t.clock !== "event" && t.clock !== "processing") throw new TypeError(`"${t.clock}" is not one of the cases of clock`);
  if (typeof t.at !== "bigint") throw new TypeError(`timer at must be a BigInt (an s64), got ${typeof t.at}`);
  if (!(t.key instanceof Uint8Array)) throw new TypeError("timer key must be a Uint8Array");
}

export function setTimer(t) {
  calls.setTimer++;
  checkTimer(t);
  time.timers.set(timerId(t), { clock: t.clock, key: Uint8Array.from(t.key), at: t.at });
}

export function deleteTimer(t) {
  calls.deleteTimer++;
  checkTimer(t);
  time.timers.delete(timerId(t));
}

/** The timers set, in the host's order: event before processing, by time, then key. */
export function sortedTimers() {
  return [...time.timers.entries()].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)).map(([id, t]) => [id, t]);
}
