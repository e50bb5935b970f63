// Builds processors and reactors into components: esbuild bundles the
// TypeScript or JavaScript with the SDK into one ES module (the WIT imports
// stay imports), and componentize-js makes it a component of the world its
// export names (`processor`: stream-processor, `reactor`: stream-reactor).
//
//   npm run build                        every example in src/ into dist/
//   npm run build -- counter             one of them
//   node build.mjs FILE.ts [--out-dir D] any source file (into D, or dist/)
import { build } from "esbuild";
import { componentize } from "@bytecodealliance/componentize-js";
import { addSourceLines } from "@streamhost/guest/build";
import { mkdir, readFile, rename, writeFile } from "node:fs/promises";
import { fileURLToPath } from "node:url";
import path from "node:path";

const here = path.dirname(fileURLToPath(import.meta.url));
const wit = path.join(here, "node_modules/@streamhost/guest/wit");
const examples = ["counter", "order-totals", "welcome"];

const args = process.argv.slice(2);
let outDir = path.join(here, "dist");
const sources = [];
for (let i = 0; i < args.length; i++) {
  if (args[i] === "--out-dir") {
    outDir = path.resolve(args[++i] ?? ".");
  } else if (/\.[cm]?[jt]s$/.test(args[i])) {
    sources.push(path.resolve(args[i]));
  } else if (examples.includes(args[i])) {
    sources.push(path.join(here, "src", `${args[i]}.ts`));
  } else {
    console.error(`no example ${JSON.stringify(args[i])}: the examples are ${examples.join(", ")} (or give a .ts or .js file)`);
    process.exit(2);
  }
}
if (sources.length === 0) sources.push(...examples.map((e) => path.join(here, "src", `${e}.ts`)));

/** The world a source's export names. */
async function worldOf(source) {
  const text = await readFile(source, "utf8");
  const processor = /export\s+const\s+processor\b/.test(text);
  const reactor = /export\s+const\s+reactor\b/.test(text);
  if (processor && reactor) {
    throw new Error(`${source} exports both processor and reactor: a JavaScript component exports one; build two`);
  }
  if (!processor && !reactor) {
    throw new Error(`${source} exports neither processor (defineProcessor) nor reactor (defineReactor)`);
  }
  return reactor ? "stream-reactor" : "stream-processor";
}

await mkdir(outDir, { recursive: true });
for (const source of sources) {
  const started = Date.now();
  const name = path.basename(source).replace(/\.[cm]?[jt]s$/, "");
  const world = await worldOf(source);
  const bundle = path.join(outDir, `${name}.bundle.js`);
  await build({
    entryPoints: [source],
    bundle: true,
    format: "esm",
    platform: "neutral",
    external: ["wasi:*"],
    nodePaths: [path.join(here, "node_modules")],
    outfile: bundle,
    logLevel: "warning",
    sourcemap: "external",
  });
  // A thrown error names the source file and line, not the bundle's.
  await addSourceLines(bundle);
  const { component } = await componentize({
    sourcePath: bundle,
    witPath: wit,
    worldName: world,
    // A fold needs no network.
    disableFeatures: ["http", "fetch-event"],
  });
  // Written whole, then renamed: a reader never sees half a component.
  const out = path.join(outDir, `${name}.wasm`);
  await writeFile(`${out}.tmp`, component);
  await rename(`${out}.tmp`, out);
  const size = (component.length / 1048576).toFixed(1);
  console.log(`built ${path.relative(process.cwd(), out)} (${world}, ${size} MiB) in ${((Date.now() - started) / 1000).toFixed(1)} s`);
}
