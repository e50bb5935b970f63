// Build-time help (Node.js), for the scripts that bundle a processor with
// esbuild before componentize-js makes it a component: a thrown error's
// position then names the author's file and line, not the bundle's.
//
//   await build({ ..., outfile: bundle, sourcemap: "external" });
//   await addSourceLines(bundle);   // before componentize
import { readFile, rm, writeFile } from "node:fs/promises";
import path from "node:path";
import { fileURLToPath } from "node:url";

const BASE64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/**
 * For each line of the generated file, the source and line (1-based) its
 * first mapped segment comes from, or `null`: a source map's `mappings`
 * (Source Map v3, base64 VLQ) decoded line by line.
 */
export function sourceLines(mappings) {
  const lines = [];
  // Every field but the generated column is relative to the previous
  // segment over the whole map.
  let source = 0;
  let line = 0;
  let column = 0;
  let name = 0;
  for (const generated of mappings.split(";")) {
    let first = null;
    for (const segment of generated.split(",")) {
      if (segment === "") continue;
      const fields = [];
      let value = 0;
      let shift = 0;
      for (const ch of segment) {
        const digit = BASE64.indexOf(ch);
        if (digit < 0) throw new Error(`a source map's mappings hold ${JSON.stringify(ch)}, not base64`);
        value += (digit & 31) << shift;
        if (digit & 32) {
          shift += 5;
        } else {
          fields.push(value & 1 ? -(value >>> 1) : value >>> 1);
          value = 0;
          shift = 0;
        }
      }
      if (fields.length >= 4) {
        source += fields[1];
        line += fields[2];
        column += fields[3];
        if (fields.length >= 5) name += fields[4];
        if (first === null) first = [source, line + 1];
      }
    }
    lines.push(first);
  }
  return lines;
}

/**
 * Reads `${bundle}.map` (esbuild's `sourcemap: "external"`), appends to the
 * bundle the table the SDK maps a thrown error's frames with (sources
 * relative to the directory the build runs in), and removes the map.
 */
export async function addSourceLines(bundle) {
  const mapFile = `${bundle}.map`;
  const map = JSON.parse(await readFile(mapFile, "utf8"));
  const base = path.dirname(path.resolve(mapFile));
  const absolute = map.sources.map((s) => path.resolve(base, map.sourceRoot ?? "", s));
  const sources = absolute.map((s) => path.relative(process.cwd(), s));
  // The SDK's own files (this directory): their frames say nothing to the
  // author and are left out of a failure's stack.
  const sdkDir = path.dirname(fileURLToPath(import.meta.url)) + path.sep;
  const sdk = absolute.flatMap((s, i) => (s.startsWith(sdkDir) ? [i] : []));
  const table = { file: path.basename(bundle), sources, sdk, lines: sourceLines(map.mappings) };
  const code = await readFile(bundle, "utf8");
  await writeFile(bundle, `${code}\nglobalThis.__streamhostSourceLines = ${JSON.stringify(table)};\n`);
  await rm(mapFile);
}
