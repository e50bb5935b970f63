declare module 'streamhost:processor/reactor@0.3.0' {
  /**
   * `event` is the committed event as the HTTP API serves it (`offset`,
   * `type`, `payload`, `createdAt`, and when present `metadata`,
   * `idempotencyKey`, `source`).
   */
  export function react(event: Json): Array<Effect>;
  /**
   * JSON text.
   */
  export type Json = string;
  /**
   * Why the event may not be appended (the append answers
   * `422 reactor-failed` with this message). `retryable` tells the
   * appender whether the same append may succeed later.
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
}
