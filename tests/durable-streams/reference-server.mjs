// The protocol's own Node reference server (in memory), for comparison:
// node reference-server.mjs PORT LONG_POLL_MS
import { DurableStreamTestServer } from "@durable-streams/server"

const port = Number(process.argv[2] ?? 4437)
const longPollTimeout = Number(process.argv[3] ?? 20000)
const server = new DurableStreamTestServer({ port, host: "127.0.0.1", longPollTimeout })
console.log(await server.start())
