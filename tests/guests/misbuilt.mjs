// Builds two components the way an author could get wrong, for the tests
// of what a deploy refuses (scripts/build-language-guests runs it after the
// examples): the JavaScript counter built with componentize-js's defaults
// (which import wasi:http), and built against a wit/ of another version.
//
//   node tests/guests/misbuilt.mjs   into tests/guests/dist
import { cp, mkdtemp, readFile, rename, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const root = path.join(path.dirname(fileURLToPath(import.meta.url)), "../..");
const js = path.join(root, "examples/js");
// componentize-js as examples/js installed it (an ES module only: its
// package.json names the file to import).
const tool = path.join(js, "node_modules/@bytecodealliance/componentize-js");
const { exports } = JSON.parse(await readFile(path.join(tool, "package.json"), "utf8"));
const { componentize } = await import(pathToFileURL(path.join(tool, exports.import)));
const wit = path.join(js, "node_modules/@streamhost/guest/wit");
const bundle = path.join(js, "dist/counter.bundle.js");
const out = path.join(root, "tests/guests/dist");

async function write(name, component) {
  const file = path.join(out, name);
  await writeFile(`${file}.tmp`, component);
  await rename(`${file}.tmp`, file);
  console.log(`built ${path.relative(root, file)} (${(component.length / 1048576).toFixed(1)} MiB)`);
}

// componentize-js's defaults: the http and fetch-event features stay in.
await write("with-http.wasm", (await componentize({ sourcePath: bundle, witPath: wit, worldName: "stream-processor" })).component);

// wit/ as an older release had it: the same interfaces at version 0.1.0.
const old = await mkdtemp(path.join(tmpdir(), "streamhost-old-wit-"));
try {
  await cp(wit, old, { recursive: true, dereference: true });
  const file = path.join(old, "processor.wit");
  const text = await readFile(file, "utf8");
  const older = text.replace(/^package streamhost:processor@[^;]+;/m, "package streamhost:processor@0.1.0;");
  if (older === text) throw new Error(`no package line in ${file}`);
  await writeFile(file, older);
  const { component } = await componentize({
    sourcePath: bundle,
    witPath: old,
    worldName: "stream-processor",
    disableFeatures: ["http", "fetch-event"],
  });
  await write("old-wit.wasm", component);
} finally {
  await rm(old, { recursive: true, force: true });
}
