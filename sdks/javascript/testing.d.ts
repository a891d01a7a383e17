// TypeScript declarations of sluice-guest/testing (testing.js).
import type { Timer, TransformExports, WitInputRecord, WitOutputRecord } from "./sluice.js";

export function setWatermark(at: number | bigint | undefined): void;
export function setProcessingTime(at: number | bigint): void;
export function takeDue(): Timer[];
export function pending(): Timer[];
export function reset(): void;
export function resetState(): void;
export function finish(): void;
export function state(): Array<[Uint8Array, Uint8Array]>;
export function calls(): { [fn: string]: number };
export function logLines(): Array<[string, string]>;
export function expire(timer: Timer): boolean;
export function inputRecord(
  line: string | object,
  offset: number,
  options?: { topic?: string; partition?: number },
): WitInputRecord;
export function outputLine(r: WitOutputRecord): string;
export function exec(
  world: Pick<TransformExports, "init" | "process"> & Partial<Pick<TransformExports, "onTimers">>,
  input: string,
  options?: { batchSize?: number; config?: Array<[string, string]> },
): string[];
