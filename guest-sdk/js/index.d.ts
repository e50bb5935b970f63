// Types of @streamhost/guest. The WIT types (`StreamInfo`, the raw
// exports) are generated from `wit/` by `jco guest-types` into `types/`.
/// <reference path="./types/stream-processor.d.ts" />
/// <reference path="./types/stream-reactor.d.ts" />
import type { StreamInfo } from "streamhost:processor/processor@0.3.0";

export type { StreamInfo };

/** A JSON value. */
export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };

/** The prefix of the platform's own event types (`events.iterate.com/`). */
export declare const PLATFORM_TYPE_PREFIX: string;

/** One committed event, as the HTTP API serves it, its payload parsed. */
export interface Event<P = any> {
  /** Its offset in the stream (dense, from 1). */
  offset: number;
  type: string;
  payload: P;
  metadata?: Json;
  /** When it was committed (RFC 3339, milliseconds). */
  createdAt: string;
  idempotencyKey?: string;
  /** Where the platform copied it from, or which effect appended it. */
  source?: Json;
  /**
   * Set when its payload and metadata were erased (`:redact`); its
   * `payload` is then `null`: a fold decides what a redacted event means
   * to it (a refold meets it as redacted).
   */
  redacted?: { at: string; reason: string };
}

/**
 * A failed fold or reaction: `retryable` ones are retried with backoff,
 * others halt the subscription (a reactor's fail the append). Anything
 * else thrown is a fatal failure whose message is the error and its stack.
 */
export declare class Failure extends Error {
  constructor(message: string, options?: { retryable?: boolean });
  readonly retryable: boolean;
  /** A failure worth retrying (a passing condition). */
  static retryable(message: string): Failure;
  /** A failure retrying cannot cure (bad data, a bug). */
  static fatal(message: string): Failure;
}

/** The effect just asked for: give it a time and an envelope. */
export interface AskedEffect {
  /**
   * Not before `ms` milliseconds after the event being folded (its
   * `createdAt`). A delayed `append` to the processor's own stream is a timer.
   */
  after(ms: number | bigint): AskedEffect;
  /** Not before `ms` milliseconds since the epoch (in the past: at once). */
  at(ms: number | bigint): AskedEffect;
  /** Its type (`SendWelcome`). */
  typed(type: string): AskedEffect;
  /** Its metadata, a JSON object. */
  withMetadata(metadata: { [key: string]: Json }): AskedEffect;
  /** Its ordering group (kept and served with the effect). */
  inGroup(group: string): AskedEffect;
}

/** Effects to run after the commit, each with a key that makes it idempotent. */
export declare class Effects {
  /** Append an event to a stream of the same project. */
  append(key: string, streamPath: string, type: string, payload: unknown): AskedEffect;
  /** POST a JSON body to a URL. */
  webhook(key: string, url: string, body: unknown): AskedEffect;
  /** Call an ITX expression (`["components", ["get", NAME], FUNCTION]`) with JSON arguments. */
  itx(key: string, expression: unknown, args: unknown): AskedEffect;
  /**
   * Cancel this processor's (or reactor's) pending effect `key` on this
   * stream (a timer not yet due); its own key is `cancel:<key>`.
   */
  cancel(key: string): AskedEffect;
  /** The time of the event being folded (ms since the epoch, its `createdAt`). */
  readonly nowMs: number;
  /** How many effects were asked for so far. */
  readonly length: number;
}

/** What a fold may use besides the state: the stream, and effects. */
export declare class Context extends Effects {
  readonly stream: StreamInfo;
}

/** A processor: who it is, its initial state and its fold. */
export interface ProcessorDefinition<S> {
  /** A short name for the processor. */
  slug: string;
  /** Its version, for humans (the host identifies versions by digest). */
  version: string;
  /** Event types to fold; empty or absent: all but the platform's. */
  consumes?: string[];
  /** Whether `fold` sees the platform's own events too. */
  platformEvents?: boolean;
  /** The state before the first event. */
  initialState(): S;
  /**
   * Folds one event: returns the new state, or changes `state` in place and
   * returns nothing. Keep it deterministic.
   */
  fold(state: S, event: Event, ctx: Context): S | void;
  /** The keyed-state keys folding `event` will read (read ahead in one call). */
  prefetch?(event: Event): string[];
}

/** The raw `processor` export that componentize-js binds. */
export type ProcessorExport = typeof import("streamhost:processor/processor@0.3.0");

/** The `processor` export of a component, from a definition. */
export declare function defineProcessor<S>(def: ProcessorDefinition<S>): ProcessorExport;

/** A reactor: the effects of one appended event, committed with it. */
export interface ReactorDefinition {
  /** A throw fails the append that carries the event (`422 reactor-failed`). */
  react(event: Event, effects: Effects): void;
}

/** The raw `reactor` export that componentize-js binds. */
export type ReactorExport = typeof import("streamhost:processor/reactor@0.3.0");

/** The `reactor` export of a component, from a definition. */
export declare function defineReactor(def: ReactorDefinition): ReactorExport;

/** The WIT failure of anything a fold or reaction threw. */
export declare function failureOf(thrown: unknown): { message: string; retryable: boolean };
