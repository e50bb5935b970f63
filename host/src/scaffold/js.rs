//! A processor project in TypeScript or JavaScript: `npm install` and
//! `npm run build` (esbuild bundles the source with the SDK,
//! componentize-js makes the component), `npm test` (`streamhost test`).

use super::{readme_after_build, Sdk, EXPECTED, SAMPLE};

/// The files of a new TypeScript (`typescript`) or JavaScript project.
pub(super) fn files(name: &str, sdk: &Sdk, typescript: bool) -> Vec<(&'static str, String)> {
    let (source, lang) = if typescript {
        ("src/processor.ts", "TypeScript")
    } else {
        ("src/processor.js", "JavaScript")
    };
    let sdk_dependency = match sdk {
        Sdk::Path(p) => format!("file:{}", p.display()),
        // npm takes no subdirectory of a git repository; the CLI refuses
        // --sdk-git for these languages before it gets here.
        Sdk::Git(url) => url.clone(),
    };
    let typescript_dependency = if typescript {
        ",\n    \"typescript\": \"5.9.3\""
    } else {
        ""
    };
    let check_script = if typescript {
        "\n    \"check\": \"tsc --noEmit\","
    } else {
        ""
    };
    // componentize-js 0.23.0 imports preview2-shim without declaring it
    // (only as a development dependency): named here, or `npm ci` from a
    // lock file leaves it out.
    let package = format!(
        r#"{{
  "name": "{name}",
  "version": "0.1.0",
  "private": true,
  "type": "module",
  "scripts": {{
    "build": "node build.mjs",{check_script}
    "test": "streamhost test {name}.wasm --events events.jsonl --expect expected.json"
  }},
  "dependencies": {{
    "@streamhost/guest": {sdk_dependency:?}
  }},
  "devDependencies": {{
    "@bytecodealliance/componentize-js": "0.23.0",
    "@bytecodealliance/preview2-shim": "0.25.0",
    "esbuild": "0.28.2"{typescript_dependency}
  }}
}}
"#
    );
    let build = format!(
        r#"// `npm run build`: esbuild bundles {source} with the SDK into one ES
// module (the WIT imports stay imports), and componentize-js makes it a
// component of the world streamhost processors are built against.
import {{ build }} from "esbuild";
import {{ componentize }} from "@bytecodealliance/componentize-js";
import {{ addSourceLines }} from "@streamhost/guest/build";
import {{ mkdir, writeFile }} from "node:fs/promises";

const started = Date.now();
await mkdir("dist", {{ recursive: true }});
await build({{
  entryPoints: ["{source}"],
  bundle: true,
  format: "esm",
  platform: "neutral",
  external: ["wasi:*"],
  outfile: "dist/{name}.js",
  logLevel: "warning",
  sourcemap: "external",
}});
// A thrown error names {source} and its line, not the bundle's.
await addSourceLines("dist/{name}.js");
const {{ component }} = await componentize({{
  sourcePath: "dist/{name}.js",
  witPath: "node_modules/@streamhost/guest/wit",
  worldName: "stream-processor",
  disableFeatures: ["http", "fetch-event"],
}});
await writeFile("{name}.wasm", component);
console.log(`built {name}.wasm (${{(component.length / 1048576).toFixed(1)}} MiB) in ${{((Date.now() - started) / 1000).toFixed(1)}} s`);
"#
    );
    let (state_type, generic, amount_check) = if typescript {
        (
            r#"
/** What the processor knows, stored as JSON between batches. */
interface State {
  /** Events folded. */
  events: number;
  /** Events by type. */
  by_type: Record<string, number>;
  /** The sum of every numeric `payload.amount`. */
  total: number;
  /** The offset of the last event folded. */
  last_offset: number;
}
"#,
            "<State>",
            "const amount: unknown = event.payload?.amount;",
        )
    } else {
        ("", "", "const amount = event.payload?.amount;")
    };
    let processor = format!(
        r#"// The {name} processor: folds its stream into a state.
//
// The state is stored as JSON after every batch and handed back to the
// next one; `fold` sees one event at a time, in offset order. Keep it
// deterministic: the same events must give the same state.
//
// Keep the JSON state small: it travels whole on every wake. Per-entity
// data (a balance per account, a record per order) belongs in keyed state,
// which a wake reads and writes key by key and which commits with the
// state:
//
//   import {{ KeyedMap }} from "@streamhost/guest/keyed";
//   const totals = new KeyedMap("total/");
//   totals.set(customer, (totals.get(customer) ?? 0) + amount);
import {{ defineProcessor, Failure }} from "@streamhost/guest";
{state_type}
export const processor = defineProcessor{generic}({{
  slug: "{name}",
  version: "0.1.0",
  // Event types to fold; empty means every type but the platform's own
  // (`events.iterate.com/...`; set `platformEvents: true` for those).
  consumes: [],
  initialState: () => ({{ events: 0, by_type: {{}}, total: 0, last_offset: 0 }}),
  fold(state, event) {{
    state.events += 1;
    state.by_type[event.type] = (state.by_type[event.type] ?? 0) + 1;
    {amount_check}
    if (amount !== undefined) {{
      if (typeof amount !== "number") {{
        throw Failure.fatal(`payload.amount of the event at offset ${{event.offset}} is not a number: ${{JSON.stringify(amount)}}`);
      }}
      state.total += amount;
    }}
    state.last_offset = event.offset;
  }},
}});
"#
    );
    let tsconfig = r#"{
  "compilerOptions": {
    "target": "es2022",
    "module": "es2022",
    "lib": ["es2022", "esnext.disposable"],
    "moduleResolution": "bundler",
    "strict": true,
    "noEmit": true
  },
  "include": ["src"]
}
"#;
    let check = if typescript {
        "\nType-check it with `npm run check`.\n"
    } else {
        ""
    };
    let after_build = readme_after_build(name, "npm test", check);
    let readme = format!(
        r#"# {name}

A streamhost processor in {lang}: `{source}` folds a stream's events into
a state (events by type, the sum of `payload.amount`). It is built with
the standard component tools, pinned in `package.json`: esbuild bundles it
with the SDK (`@streamhost/guest`), componentize-js makes the component.

Build (Node.js 20 or later; `npm install` once):

```sh
npm install
npm run build
```

{after_build}
A thrown error halts the processor: its message and where it was thrown
(in `dist/{name}.js`, the bundle) are the failure's message.
`Failure.retryable(message)` is retried with backoff instead.
"#
    );
    let mut files = vec![
        ("package.json", package),
        ("build.mjs", build),
        (source, processor),
        ("events.jsonl", SAMPLE.to_string()),
        ("expected.json", EXPECTED.to_string()),
        ("README.md", readme),
        (".gitignore", "/node_modules\n/dist\n/*.wasm\n".to_string()),
    ];
    if typescript {
        files.push(("tsconfig.json", tsconfig.to_string()));
    }
    files
}
