// In-memory stand-ins for the host's `state` and `log` interfaces, with the
// same shapes as the componentize-js bindings (bytes are Uint8Arrays, `none`
// is undefined) and a count of the calls a host would have seen.

const hex = (b) => Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");

/** host key (hex) -> [key bytes, value bytes] */
export const map = new Map();
export const calls = { get: 0, getMany: 0, set: 0, delete: 0, write: 0, scanPrefix: 0 };
export const lines = [];

export function reset() {
  map.clear();
  for (const k of Object.keys(calls)) calls[k] = 0;
  lines.length = 0;
}

export function get(key) {
  calls.get++;
  return map.get(hex(key))?.[1];
}

export function getMany(keys) {
  calls.getMany++;
  return keys.map((k) => map.get(hex(k))?.[1]);
}

export function write(entries) {
  calls.write++;
  for (const [k, v] of entries) {
    if (v === undefined) map.delete(hex(k));
    else map.set(hex(k), [Uint8Array.from(k), Uint8Array.from(v)]);
  }
}

export function log(level, message) {
  lines.push([level, message]);
}
