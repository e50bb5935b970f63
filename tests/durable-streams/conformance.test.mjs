// The protocol's conformance suite against the server at
// CONFORMANCE_TEST_URL (for streamhost: http://HOST:PORT/ds/PROJECT).
import { runConformanceTests } from "@durable-streams/server-conformance-tests"

runConformanceTests({ baseUrl: process.env.CONFORMANCE_TEST_URL })
