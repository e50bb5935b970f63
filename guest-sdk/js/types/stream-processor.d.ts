/// <reference path="./interfaces/streamhost-processor-processor.d.ts" />
/// <reference path="./interfaces/wasi-keyvalue-batch.d.ts" />
/// <reference path="./interfaces/wasi-keyvalue-store.d.ts" />
declare module 'streamhost:processor/stream-processor@0.3.0' {
  export type * as WasiKeyvalueBatch020Draft from 'wasi:keyvalue/batch@0.2.0-draft'; // import wasi:keyvalue/batch@0.2.0-draft
  export type * as WasiKeyvalueStore020Draft from 'wasi:keyvalue/store@0.2.0-draft'; // import wasi:keyvalue/store@0.2.0-draft
  export * as processor from 'streamhost:processor/processor@0.3.0'; // export streamhost:processor/processor@0.3.0
}
