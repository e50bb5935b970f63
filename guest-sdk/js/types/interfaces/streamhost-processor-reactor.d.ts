declare module 'streamhost:processor/reactor@0.2.0' {
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
  export type EffectTarget = EffectTargetAppend | EffectTargetWebhook | EffectTargetItx;
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
  /**
   * Work to do after the append commits; `key` makes it idempotent (per
   * reactor and source stream). `type` and `metadata` (a JSON object) are
   * the envelope: kept with the effect, and sent with a webhook as the
   * `streamhost-effect-type` and `streamhost-effect-metadata` headers.
   */
  export interface Effect {
    key: string,
    target: EffectTarget,
    type?: string,
    metadata?: Json,
  }
}
