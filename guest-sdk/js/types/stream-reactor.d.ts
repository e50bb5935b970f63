/// <reference path="./interfaces/streamhost-processor-reactor.d.ts" />
declare module 'streamhost:processor/stream-reactor@0.3.0' {
  export * as reactor from 'streamhost:processor/reactor@0.3.0'; // export streamhost:processor/reactor@0.3.0
}
