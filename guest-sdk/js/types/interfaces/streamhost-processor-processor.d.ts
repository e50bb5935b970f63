declare module 'streamhost:processor/processor@0.3.0' {
  export function describe(): Announcement;
  export function initialState(): Json;
  export function fold(state: Json, batch: Batch): Folded;
  /**
   * JSON text.
   */
  export type Json = string;
  /**
   * The stream being folded.
   */
  export interface StreamInfo {
    projectId?: string,
    path: string,
    streamId: string,
    streamCreatedAt: string,
    maxOffset: bigint,
  }
  /**
   * Events after the processor's checkpoint. `events` is one JSON array of
   * the committed events as the HTTP API serves them (`offset`, `type`,
   * `payload`, `createdAt`, and when present `metadata`, `idempotencyKey`,
   * `source`), in offset order: one string per batch, since handing a guest
   * each field of each event as a string of its own costs more than most
   * folds. `scanned-through-offset` is the checkpoint after this batch
   * (events the processor does not consume are passed over).
   */
  export interface Batch {
    stream: StreamInfo,
    events: Json,
    scannedThroughOffset: bigint,
  }
  /**
   * A fold that failed; `retryable: false` halts delivery at once.
   */
  export interface Failure {
    message: string,
    retryable: boolean,
  }
  export interface AppendEffect {
    streamPath: string,
    type: string,
    payload: Json,
    metadata?: Json,
  }
  export interface WebhookEffect {
    url: string,
    body: Json,
  }
  export interface ItxEffect {
    expression: Json,
    args: Json,
  }
  /**
   * What an effect does. `cancel(key)` cancels this processor's (or this
   * reactor's) effect with that key on the same stream if it is still
   * pending (not yet attempted, or waiting for its `not-before`); of a
   * running, settled or unknown one it does nothing. It applies in the
   * commit that stores it, after the commit's other effects.
   */
  export type EffectTarget = EffectTargetAppend | EffectTargetWebhook | EffectTargetItx | EffectTargetCancel;
  export interface EffectTargetAppend {
    tag: 'append',
    val: AppendEffect,
  }
  export interface EffectTargetWebhook {
    tag: 'webhook',
    val: WebhookEffect,
  }
  export interface EffectTargetItx {
    tag: 'itx',
    val: ItxEffect,
  }
  export interface EffectTargetCancel {
    tag: 'cancel',
    val: string,
  }
  /**
   * Work to do after the commit; `key` makes it idempotent (per processor
   * or reactor and source stream).
   */
  export interface Effect {
    key: string,
    target: EffectTarget,
    /**
     * Not attempted before this time, in milliseconds since the epoch (in
     * the past: at once; at most 10 years after the event that asks it).
     */
    notBefore?: bigint,
    /**
     * The envelope: kept with the effect and served with it; a webhook
     * sends it as the `streamhost-effect-type` and
     * `streamhost-effect-metadata` headers. `metadata` is a JSON object.
     */
    type?: string,
    metadata?: Json,
    /**
     * Effects of one group are ordered (kept and served with the effect).
     */
    group?: string,
  }
  /**
   * Who the processor is and which event types it consumes (empty: all).
   */
  export interface Announcement {
    slug: string,
    version: string,
    consumes: Array<string>,
  }
  /**
   * The state after a batch, and the effects it produced.
   */
  export interface Folded {
    state: Json,
    effects: Array<Effect>,
  }
}
