// @streamhost/guest: write a streamhost processor or reactor in JavaScript
// or TypeScript. The SDK wraps the bindings that componentize-js generates
// from `wit/` (the world `stream-processor` or `stream-reactor`): no private
// ABI, so a guest built without it works the same.
//
//   import { processor } from "@streamhost/guest";
//   export const processor = defineProcessor({ ... });
//
// See README.md for the whole surface; index.d.ts for the types.

/** The prefix of the platform's own event types. */
export const PLATFORM_TYPE_PREFIX = "events.iterate.com/";

/**
 * A failed fold or reaction. `retryable` failures are retried with backoff;
 * others halt the subscription (a reactor's fail the append).
 */
export class Failure extends Error {
  constructor(message, { retryable = false } = {}) {
    super(message);
    this.name = "Failure";
    this.retryable = retryable;
  }

  /** A failure worth retrying (a passing condition). */
  static retryable(message) {
    return new Failure(message, { retryable: true });
  }

  /** A failure retrying cannot cure (bad data, a bug): the subscription halts. */
  static fatal(message) {
    return new Failure(message, { retryable: false });
  }
}

/** JSON text of a value; a value JSON cannot hold is the author's bug. */
function jsonText(value, what) {
  const text = JSON.stringify(value);
  if (text === undefined) {
    throw Failure.fatal(`${what} is not a JSON value: ${String(value)}`);
  }
  return text;
}

/** Milliseconds as WIT's `u64` (a BigInt), checked. */
function millis(ms, what) {
  if (typeof ms === "bigint") return ms;
  if (typeof ms !== "number" || !Number.isFinite(ms) || ms < 0) {
    throw Failure.fatal(`${what} must be a non-negative number of milliseconds, not ${String(ms)}`);
  }
  return BigInt(Math.trunc(ms));
}

/** A `createdAt` in milliseconds since the epoch (0 if it is not a time). */
function timeMs(createdAt) {
  const ms = Date.parse(createdAt ?? "");
  return Number.isFinite(ms) ? ms : 0;
}

/**
 * One effect as asked for: `after`/`at` give it a time, `typed`,
 * `withMetadata` and `inGroup` an envelope.
 */
class Asked {
  constructor(key, target, createdAt) {
    if (typeof key !== "string" || key === "") {
      throw Failure.fatal(`an effect's key must be a non-empty string, not ${JSON.stringify(key)}`);
    }
    this.key = key;
    this.target = target;
    this.notBefore = undefined;
    this.type = undefined;
    this.metadata = undefined;
    this.group = undefined;
    this.createdAt = createdAt;
  }

  /**
   * Not before `ms` milliseconds after the event being folded (its
   * `createdAt`: refolds and shadows compute the same time). A delayed
   * `append` to the processor's own stream is a timer.
   */
  after(ms) {
    this.notBefore = BigInt(timeMs(this.createdAt)) + millis(ms, "after()");
    return this;
  }

  /** Not before `ms` (milliseconds since the epoch; in the past: at once). */
  at(ms) {
    this.notBefore = millis(ms, "at()");
    return this;
  }

  /** Its type (`SendWelcome`). */
  typed(type) {
    this.type = String(type);
    return this;
  }

  /** Its metadata, a JSON object. */
  withMetadata(metadata) {
    this.metadata = jsonText(metadata, "an effect's metadata");
    return this;
  }

  /** Its ordering group (kept and served with the effect). */
  inGroup(group) {
    this.group = String(group);
    return this;
  }

  /** The WIT record. */
  toWit() {
    return {
      key: this.key,
      target: this.target,
      notBefore: this.notBefore,
      type: this.type,
      metadata: this.metadata,
      group: this.group,
    };
  }
}

/**
 * Effects to run after the commit (a fold's or a reactor's), each with a
 * key that makes it idempotent.
 */
export class Effects {
  constructor() {
    this.asked = [];
    /** The `createdAt` of the event being folded (read only when asked). */
    this.createdAt = undefined;
  }

  /** The time of the event being folded (ms since the epoch, its `createdAt`). */
  get nowMs() {
    return timeMs(this.createdAt);
  }

  #ask(key, target) {
    const asked = new Asked(key, target, this.createdAt);
    this.asked.push(asked);
    return asked;
  }

  /**
   * Cancel this processor's (or reactor's) effect `key` on this stream if it
   * is still pending (a timer not yet due, say); of a running, settled or
   * unknown one it does nothing. Its own key is `cancel:<key>`.
   */
  cancel(key) {
    return this.#ask(`cancel:${key}`, { tag: "cancel", val: String(key) });
  }

  /** Append an event to a stream of the same project after the commit. */
  append(key, streamPath, type, payload) {
    return this.#ask(key, {
      tag: "append",
      val: { streamPath, type, payload: jsonText(payload, "an append effect's payload") },
    });
  }

  /** POST a JSON body to a URL after the commit. */
  webhook(key, url, body) {
    return this.#ask(key, {
      tag: "webhook",
      val: { url, body: jsonText(body, "a webhook effect's body") },
    });
  }

  /**
   * Call an ITX expression (`["components", ["get", NAME], FUNCTION]`) with
   * JSON arguments after the commit; the result is kept with the effect.
   */
  itx(key, expression, args) {
    return this.#ask(key, {
      tag: "itx",
      val: {
        expression: jsonText(expression, "an ITX effect's expression"),
        args: jsonText(args, "an ITX effect's arguments"),
      },
    });
  }

  /** How many effects were asked for so far. */
  get length() {
    return this.asked.length;
  }
}

/** What a fold may use besides the state: the stream, and effects. */
export class Context extends Effects {
  constructor(stream) {
    super();
    /** The stream being folded (`path`, `projectId`, `maxOffset`, ...). */
    this.stream = stream;
  }
}

/** The WIT failure of anything a fold or reaction threw. */
export function failureOf(thrown) {
  if (thrown instanceof Failure) {
    return { message: thrown.message, retryable: thrown.retryable };
  }
  // A bug: the same events throw the same way, so retrying cannot cure it.
  // The message leads with the error's own text, then where it was thrown.
  let message;
  if (thrown instanceof Error) {
    // Frames of the bindings componentize-js generated say nothing to the
    // author; the first frame left is where the error was thrown.
    const frames = (typeof thrown.stack === "string" ? thrown.stack : "")
      .split("\n")
      .map((f) => f.trim())
      .filter((f) => f !== "" && !f.includes("initializer.js"))
      .map(authorsPosition);
    // The SDK's own frames too, when the build said which they are.
    const authors = frames.filter((f) => !f.sdk);
    if (authors.length > 0) frames.splice(0, frames.length, ...authors);
    const at = frames.length > 0 ? ` (at ${frames[0].text.slice(frames[0].text.indexOf("@") + 1)})` : "";
    message = `${thrown.name}: ${thrown.message}${at}`;
    if (frames.length > 0) message += `\n${frames.map((f) => f.text).join("\n")}`;
  } else {
    message = `uncaught exception: ${safeText(thrown)}`;
  }
  return { message, retryable: false };
}

/**
 * A stack frame (`fold@dist/x.bundle.js:12:7`) with the bundle's position
 * replaced by the author's file and line, when the build added the table
 * (`addSourceLines` of `@streamhost/guest/build`), and whether it is a frame
 * of the SDK itself: `{ text, sdk }`.
 */
function authorsPosition(frame) {
  const table = globalThis.__streamhostSourceLines;
  const found = /^(.*?)([^@]*):(\d+):(\d+)$/.exec(frame);
  if (!table || !found || !found[2].endsWith(table.file)) return { text: frame, sdk: false };
  const at = table.lines[Number(found[3]) - 1];
  if (!at || table.sources[at[0]] === undefined) return { text: frame, sdk: false };
  return {
    text: `${found[1]}${table.sources[at[0]]}:${at[1]}`,
    sdk: (table.sdk ?? []).includes(at[0]),
  };
}

function safeText(value) {
  try {
    return typeof value === "string" ? value : JSON.stringify(value) ?? String(value);
  } catch {
    return String(value);
  }
}

/** Throws the WIT `err` of a result-returning export (jco's convention). */
function fail(thrown) {
  throw { payload: failureOf(thrown) };
}

function parseJson(text, what) {
  try {
    return JSON.parse(text);
  } catch (e) {
    throw Failure.fatal(`${what}: ${e.message}`);
  }
}

function checkDefinition(def, required) {
  if (def === null || typeof def !== "object") {
    throw new TypeError(`a processor definition is an object, not ${safeText(def)}`);
  }
  for (const name of required) {
    if (typeof def[name] !== "function") {
      throw new TypeError(`the definition's ${name} must be a function, not ${typeof def[name]}`);
    }
  }
}

/**
 * The `processor` export of a component (world `stream-processor`), from a
 * definition: `slug`, `version`, `consumes` (event types; empty: all but the
 * platform's), `platformEvents` (fold the platform's events too),
 * `initialState()` (a JSON value), `fold(state, event, ctx)` (returns the
 * new state, or changes `state` in place and returns nothing) and optionally
 * `prefetch(event)` (the keyed-state keys folding `event` will read).
 *
 *   export const processor = defineProcessor({ slug: "counter", ... });
 */
export function defineProcessor(def) {
  checkDefinition(def, ["initialState", "fold"]);
  const slug = String(def.slug ?? "");
  const version = String(def.version ?? "0.0.0");
  const consumes = Array.from(def.consumes ?? [], String);
  const platformEvents = Boolean(def.platformEvents);
  const folds = (event) =>
    platformEvents || !event.type.startsWith(PLATFORM_TYPE_PREFIX) || consumes.includes(event.type);
  return {
    describe() {
      return { slug, version, consumes };
    },
    initialState() {
      return jsonText(def.initialState(), "the initial state");
    },
    fold(stateText, batch) {
      try {
        let state = parseJson(stateText, "the stored state is not JSON");
        const events = parseJson(batch.events, "the batch's events are not the JSON array the host sends");
        const folded = events.filter(folds);
        if (typeof def.prefetch === "function") {
          const keys = new Set();
          for (const event of folded) {
            for (const key of def.prefetch(event) ?? []) keys.add(String(key));
          }
          if (keys.size > 0) {
            if (typeof globalThis.__streamhostPrefetch !== "function") {
              throw Failure.fatal("prefetch needs keyed state: import \"@streamhost/guest/keyed\"");
            }
            globalThis.__streamhostPrefetch([...keys].sort());
          }
        }
        const ctx = new Context(batch.stream);
        for (const event of folded) {
          ctx.createdAt = event.createdAt;
          const next = def.fold(state, event, ctx);
          if (next !== undefined) state = next;
        }
        return {
          state: jsonText(state, "the state"),
          effects: ctx.asked.map((a) => a.toWit()),
        };
      } catch (thrown) {
        fail(thrown);
      }
    },
  };
}

/**
 * The `reactor` export of a component (world `stream-reactor`), from a
 * definition with `react(event, effects)`: the effects of one appended
 * event, committed with it; a throw fails the append (`422 reactor-failed`).
 *
 *   export const reactor = defineReactor({ react(event, effects) { ... } });
 */
export function defineReactor(def) {
  checkDefinition(def, ["react"]);
  return {
    react(eventText) {
      try {
        const event = parseJson(eventText, "the event is not the JSON object the host sends");
        const effects = new Effects();
        effects.createdAt = event.createdAt;
        def.react(event, effects);
        return effects.asked.map((a) => a.toWit());
      } catch (thrown) {
        fail(thrown);
      }
    },
  };
}
