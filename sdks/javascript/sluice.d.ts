// TypeScript declarations of sluice-guest (sluice.js): the public API.

/** Bytes the SDK takes: a string is encoded as UTF-8. */
export type Bytes = Uint8Array | string;
/** Milliseconds: a whole number, or a BigInt for exactness beyond 2^53. */
export type Millis = number | bigint;
/** The clock a timer follows (the WIT enum `time.clock`). */
export type Clock = "event" | "processing";

/** The SDK's version. */
export const VERSION: string;
/** The bounds of the WIT's `s64`. */
export const I64_MIN: bigint;
export const I64_MAX: bigint;

/** A failure whose message is reported as is (no error-name prefix). */
export class SluiceError extends Error {
  constructor(message: string);
}

/** The shard's watermark as of the start of this call; `undefined` until there is one. */
export function watermark(): number | undefined;
/** The host's clock as of the start of this call (ms since the Unix epoch). */
export function processingTime(): number;

/** A timer as the WIT (and componentize-js) has it. */
export interface WitTimer {
  clock: Clock;
  key: Uint8Array;
  at: bigint;
}

/** A timer: `key` at `at` (ms since the Unix epoch) on `clock`. */
export class Timer {
  constructor(clock: Clock, key: Bytes, at: Millis);
  static event(key: Bytes, at: Millis): Timer;
  static processing(key: Bytes, at: Millis): Timer;
  static fromWit(t: WitTimer | Timer): Timer;
  /** Orders by clock (event first), time, key. */
  static compare(a: Timer, b: Timer): number;
  readonly clock: Clock;
  readonly key: Uint8Array;
  /** When it is due, exactly. */
  readonly atBigInt: bigint;
  /** When it is due (exact up to 2^53). */
  readonly at: number;
  /** Sets it (no-op if set already). */
  set(): void;
  /** Deletes it (no-op if not set). */
  delete(): void;
  keyStr(): string;
  toWit(): WitTimer;
  equals(other: Timer): boolean;
}

/** A WIT `input-record` as componentize-js hands it over. */
export interface WitInputRecord {
  key?: Uint8Array;
  value?: Uint8Array;
  headers: Array<{ key: string; value: Uint8Array }>;
  timestamp?: bigint;
  topic: string;
  partition: number;
  offset: bigint;
}

/** A WIT `output-record`. */
export interface WitOutputRecord {
  key?: Uint8Array;
  value?: Uint8Array;
  headers: Array<{ key: string; value: Uint8Array }>;
  topic?: string;
}

/** One input record. */
export class Record {
  constructor(inner: WitInputRecord);
  readonly key: Uint8Array | undefined;
  keyOrEmpty(): Uint8Array;
  keyStr(): string;
  readonly value: Uint8Array | undefined;
  isTombstone(): boolean;
  valueStr(): string;
  json(): any;
  readonly headers: Array<[string, Uint8Array]>;
  header(name: string): Uint8Array | undefined;
  /** ms since the Unix epoch, if the record has a timestamp. */
  readonly timestamp: number | undefined;
  readonly timestampBigInt: bigint | undefined;
  /** Whether the timestamp is at or below the watermark. */
  isLate(): boolean;
  readonly topic: string;
  readonly partition: number;
  readonly offset: number;
}

/** The records of one `process` call, in input order. */
export class Batch implements Iterable<Record> {
  constructor(records: Record[]);
  readonly records: Record[];
  readonly length: number;
  keys(): Uint8Array[];
  [Symbol.iterator](): Iterator<Record>;
}

export interface EmitOptions {
  headers?: Array<[string, Bytes]>;
  topic?: string;
}

/** Collects a call's output records. */
export class Emitter {
  readonly records: WitOutputRecord[];
  readonly length: number;
  emit(key: Bytes | null | undefined, value: Bytes | null | undefined, options?: EmitOptions): void;
  emitJson(key: Bytes | null | undefined, value: any, options?: EmitOptions): void;
  forward(record: Record, options?: { topic?: string }): void;
}

/** The job's transform configuration. */
export class Config {
  constructor(pairs?: Array<[string, string]>);
  get(name: string): string | undefined;
  require(name: string): string;
  parse<T>(name: string, convert: (raw: string) => T, fallback?: T): T | undefined;
  parse<T>(name: string, convert: (raw: string) => T, fallback: T): T;
  /** A duration such as "10s", "1m 30s", "500ms", in whole ms. */
  durationMs(name: string): number | undefined;
  durationMs(name: string, fallback: number): number;
  choice<T extends string>(name: string, allowed: readonly T[], fallback?: T): T | undefined;
  entries(): Array<[string, string]>;
  readonly size: number;
}

export interface TtlOptions {
  /** Entries expire this many ms of processing time after they were last written (0: never). */
  ttlMs?: Millis;
}

/** One JSON value per record key, under `name 0x00 key`. */
export class ValueState<T = any> {
  constructor(name: string, options?: TtlOptions);
  readonly name: string;
  readonly ttlMs: number;
  withTtl(ms: Millis): ValueState<T>;
  key(key: Bytes): Uint8Array;
  get(key: Bytes): T | undefined;
  set(key: Bytes, value: T): void;
  update(key: Bytes, f: (current: T | undefined) => T): T;
  clear(key: Bytes): void;
  prefetch(keys: Iterable<Bytes>): void;
}

/** A list per record key, one JSON array under `name 0x00 key`. */
export class ListState<T = any> {
  constructor(name: string);
  readonly name: string;
  key(key: Bytes): Uint8Array;
  push(key: Bytes, item: T): void;
  get(key: Bytes): T[];
  set(key: Bytes, items: Iterable<T>): void;
  clear(key: Bytes): void;
  prefetch(keys: Iterable<Bytes>): void;
}

export type MapKeyName =
  | "str" | "string" | "bytes"
  | "u8" | "u16" | "u32" | "u64" | "u128"
  | "i8" | "i16" | "i32" | "i64" | "i128";

/** How map keys become bytes (the cross-language key layout). */
export class MapKey {
  static readonly STR: MapKey;
  static readonly BYTES: MapKey;
  static readonly U8: MapKey;
  static readonly U16: MapKey;
  static readonly U32: MapKey;
  static readonly U64: MapKey;
  static readonly U128: MapKey;
  static readonly I8: MapKey;
  static readonly I16: MapKey;
  static readonly I32: MapKey;
  static readonly I64: MapKey;
  static readonly I128: MapKey;
  static of(keyType: MapKey | MapKeyName): MapKey;
  readonly name: string;
  encode(value: string | Uint8Array | number | bigint): Uint8Array;
  /** A string, a Uint8Array, a number (integers up to 32 bits) or a BigInt (64 and 128 bits). */
  decode(raw: Uint8Array): string | Uint8Array | number | bigint;
}

export interface MapStateOptions extends TtlOptions {
  /** Default "str". */
  keyType?: MapKey | MapKeyName;
}

/** A map per record key: entries under `name 0x00 u32-be(len(key)) key map-key`. */
export class MapState<K = any, V = any> {
  constructor(name: string, options?: MapStateOptions);
  readonly name: string;
  readonly keyType: MapKey;
  readonly ttlMs: number;
  withTtl(ms: Millis): MapState<K, V>;
  prefix(key: Bytes): Uint8Array;
  key(key: Bytes, mapKey: K): Uint8Array;
  get(key: Bytes, mapKey: K): V | undefined;
  set(key: Bytes, mapKey: K, value: V): void;
  remove(key: Bytes, mapKey: K): void;
  entries(key: Bytes): Array<[K, V]>;
  keys(key: Bytes): K[];
  clear(key: Bytes): void;
}

/** A window that closed. */
export class Window<A = any> {
  readonly key: Uint8Array;
  readonly start: number;
  readonly end: number;
  readonly startBigInt: bigint;
  readonly endBigInt: bigint;
  readonly value: A;
  keyStr(): string;
}

/**
 * How many windows one firing of a window end's timer closes at most (below
 * the host's default limit of 100 outputs per fired timer); a timer `name 0x01
 * last-key` at the same time goes on with the rest in the host's next round.
 */
export const WINDOWS_PER_FIRING: number;

/**
 * Tumbling or hopping event-time windows per record key: one accumulator per
 * key and window, one event-time timer per window end (key `name`, at
 * `end - 1 + allowed lateness`) whatever the number of keys. Window `start`
 * of key `k` is stored under `name 0x00 00 00 00 08 i64-key(start) k`.
 */
export class Windows<A = any> {
  constructor(name: string, sizeMs: Millis, slideMs?: Millis, allowedLatenessMs?: Millis);
  static tumbling<A = any>(name: string, sizeMs: Millis): Windows<A>;
  static hopping<A = any>(name: string, sizeMs: Millis, slideMs: Millis): Windows<A>;
  allowedLateness(ms: Millis): Windows<A>;
  readonly name: string;
  readonly sizeMs: number;
  readonly slideMs: number;
  readonly latenessMs: number;
  /** Folds into every open window that holds `timestamp`; returns how many took it. */
  add(key: Bytes, timestamp: Millis, fold: (acc: A | undefined) => A): number;
  addRecord(record: Record, fold: (acc: A | undefined) => A): number;
  /**
   * The windows `timer` closes (their state removed), in key byte order, at
   * most `WINDOWS_PER_FIRING` (if more remain, an event-time timer
   * `name 0x01 last-key` it sets at the same time brings the rest, going on
   * after that key);
   * empty for another timer. A timer `name 0x00 key` of a window stored per
   * key by an earlier SDK still closes that window.
   */
  fire(timer: Timer | WitTimer): Window<A>[];
}

/** Session windows per record key. */
export class SessionWindows<A = any> {
  constructor(name: string, gapMs: Millis, allowedLatenessMs?: Millis);
  allowedLateness(ms: Millis): SessionWindows<A>;
  readonly name: string;
  readonly gapMs: number;
  readonly latenessMs: number;
  /** Returns false if the record's session has fired already (too late). */
  add(key: Bytes, timestamp: Millis, fold: (acc: A | undefined) => A, merge: (a: A, b: A) => A): boolean;
  addRecord(record: Record, fold: (acc: A | undefined) => A, merge: (a: A, b: A) => A): boolean;
  /** The session `timer` closes (its state removed), or null for another timer. */
  fire(timer: Timer | WitTimer): Window<A> | null;
}

/** Lines in the host's log. */
export const log: {
  trace(...args: unknown[]): void;
  debug(...args: unknown[]): void;
  info(...args: unknown[]): void;
  warn(...args: unknown[]): void;
  error(...args: unknown[]): void;
};

/** Base class of a transform. */
export class Transform {
  constructor(config: Config);
  beginBatch(batch: Batch): void;
  process(record: Record, out: Emitter): void;
  endBatch(out: Emitter): void;
  onTimer(timer: Timer, out: Emitter): void;
  migrate(fromModule: string): void;
}

/** The world `timed`'s exports; errors are thrown as strings. */
export interface TransformExports {
  init(config: Array<[string, string]>): void;
  /** `shard`: the batch's, whose state the store may hold (packed calls); none: written back at the end. */
  process(batch: WitInputRecord[], shard?: number): WitOutputRecord[];
  migrate(fromModule: string): void;
  onTimers(fired: WitTimer[]): WitOutputRecord[];
}

/** `export const { init, process, migrate, onTimers } = exportTransform(MyTransform);` */
export function exportTransform(cls: new (config: Config) => Transform): TransformExports;

/** The exports world `packed-out` adds to `timed`; errors are thrown as strings. */
export interface PackedExports {
  /** A batch as one `packed-batch` byte string (wit/sluice.wit). */
  processPacked(batch: Uint8Array): WitOutputRecord[];
  /** A batch as one `packed-batch`; the outputs as one `packed-outputs`. */
  processPackedOut(batch: Uint8Array): Uint8Array;
  /** The host will ask for held state back: a shard's cache may stay from batch to batch, `maxBytes` in all. */
  holdState(maxBytes: bigint): void;
  /** Writes back what is held of `shard` and forgets it. */
  flushState(shard: number): void;
}

/** The packed exports over a world `timed` `process` (what build.sh's entry exports). */
export function packedExports(process: (batch: WitInputRecord[], shard?: number) => WitOutputRecord[]): PackedExports;
