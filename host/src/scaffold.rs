//! `streamhost new NAME [--lang rust|ts|js|python]`: a standalone project
//! for a processor with a working fold, a sample of events, the state it
//! folds to and a README. Rust: its own Cargo workspace, built for
//! `wasm32-wasip2` by a plain `cargo build --release` with a release
//! profile for size. TypeScript and JavaScript ([`js`]): an npm project
//! built by esbuild and componentize-js. Python ([`python`]): a module
//! built by componentize-py. The files are pure data ([`files`]);
//! [`write`] puts them on disk.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

mod js;
mod python;

/// The language of a new project.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Lang {
    /// Rust, with the `streamhost-guest` crate.
    Rust,
    /// TypeScript, with `@streamhost/guest`.
    Ts,
    /// JavaScript, with `@streamhost/guest`.
    Js,
    /// Python, with `streamhost-guest`.
    Python,
}

impl Lang {
    /// The SDK's directory in a checkout, and the file that marks it.
    fn sdk_dir(self) -> (&'static str, &'static str) {
        match self {
            Lang::Rust => ("guest-sdk", "Cargo.toml"),
            Lang::Ts | Lang::Js => ("guest-sdk/js", "package.json"),
            Lang::Python => ("guest-sdk/python", "pyproject.toml"),
        }
    }

    /// Checks that `path` holds this language's SDK.
    pub fn check_sdk_path(self, path: &Path) -> Result<()> {
        let (dir, marker) = self.sdk_dir();
        if !path.join(marker).is_file() {
            bail!(
                "--sdk-path {} holds no {marker}: name a checkout's {dir}/",
                path.display()
            );
        }
        Ok(())
    }

    /// The commands that build and fold a new project of this language.
    pub fn next_steps(self, name: &str) -> String {
        match self {
            Lang::Rust => format!(
                "  cargo build --release\n  streamhost fold target/wasm32-wasip2/release/{}.wasm --events events.jsonl",
                name.replace('-', "_")
            ),
            Lang::Ts | Lang::Js => format!(
                "  npm install\n  npm run build\n  npm test   # streamhost test {name}.wasm --events events.jsonl --expect expected.json"
            ),
            Lang::Python => format!(
                "  python3 -m venv .venv && . .venv/bin/activate && pip install -r requirements.txt\n  \
                 python -m streamhost_guest build processor -o {name}.wasm\n  \
                 streamhost test {name}.wasm --events events.jsonl --expect expected.json"
            ),
        }
    }
}

/// Where the project gets the guest SDK.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sdk {
    /// A path to the SDK (a checkout's `guest-sdk/`, `guest-sdk/js/` or
    /// `guest-sdk/python/`).
    Path(PathBuf),
    /// A git repository holding it (Rust and Python).
    Git(String),
}

impl Sdk {
    fn dependency(&self) -> String {
        match self {
            Sdk::Path(p) => format!(
                "streamhost-guest = {{ path = {:?} }}",
                p.display().to_string()
            ),
            Sdk::Git(url) => format!("streamhost-guest = {{ git = {url:?} }}"),
        }
    }

    /// The language's SDK in the repository this binary was built from, if
    /// it is still there.
    pub fn of_this_build(lang: Lang) -> Option<Sdk> {
        let (dir, marker) = lang.sdk_dir();
        let sdk = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(dir);
        sdk.join(marker)
            .is_file()
            .then(|| Sdk::Path(sdk.canonicalize().unwrap_or(sdk)))
    }
}

/// The sample events of a new project (every language).
const SAMPLE: &str = r#"{"type": "events.example/payment-received", "payload": {"amount": 30}}
{"type": "events.example/payment-received", "payload": {"amount": 12.5}}
{"type": "events.example/refund-requested", "payload": {"reason": "late"}}
"#;

/// The state the sample folds to: `streamhost test --expect`.
const EXPECTED: &str = r#"{
  "events": 3,
  "by_type": {"events.example/payment-received": 2, "events.example/refund-requested": 1},
  "total": 42.5,
  "last_offset": 3
}
"#;

/// The part of a JavaScript or Python project's README after its build
/// commands: fold the sample offline, test it with `test` (then `extra`),
/// run it on a server.
fn readme_after_build(name: &str, test: &str, extra: &str) -> String {
    format!(
        r#"The component is `{name}.wasm`. Fold the sample offline, no server needed:

```sh
streamhost fold {name}.wasm --events events.jsonl
```

Test it: the fold over the sample must end in `expected.json`, without a
failure, the same on a second run and whatever the batch cuts (as the
server cuts batches while events arrive):

```sh
{test}
```
{extra}
Run it on a server (`streamhost serve` in another terminal): deploy it,
subscribe it to a stream, append, and read its state:

```sh
streamhost deploy --project acme {name} {name}.wasm
streamhost subscribe --project acme /payments {name} --wake {name}
streamhost append --project acme /payments --type events.example/payment-received --payload '{{"amount": 30}}'
streamhost processor --project acme /payments {name} --wait
```
"#
    )
}

/// The files of a new project, as (relative path, content).
pub fn files(lang: Lang, name: &str, sdk: &Sdk) -> Vec<(&'static str, String)> {
    match lang {
        Lang::Rust => processor_files(name, sdk),
        Lang::Ts => js::files(name, sdk, true),
        Lang::Js => js::files(name, sdk, false),
        Lang::Python => python::files(name, sdk),
    }
}

/// Checks a processor name: it names the crate, the component and the
/// `.wasm` file, so it is a component name (`[a-z][a-z0-9-]{0,62}`).
pub fn validate_name(name: &str) -> Result<()> {
    let ok = name.len() <= 63
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.ends_with('-');
    if !ok {
        bail!(
            "processor name {name:?} is invalid: use lowercase letters, digits and '-', \
             starting with a letter (it names the crate and the component)"
        );
    }
    Ok(())
}

/// The files of a new Rust processor project, as (relative path, content).
pub fn processor_files(name: &str, sdk: &Sdk) -> Vec<(&'static str, String)> {
    let krate = name.replace('-', "_");
    let type_name: String = name
        .split('-')
        .map(|w| {
            let mut c = w.chars();
            c.next()
                .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                .unwrap_or_default()
        })
        .collect();
    let cargo = format!(
        r#"[package]
name = "{name}"
version = "0.1.0"
edition = "2021"
publish = false

[lib]
crate-type = ["cdylib"]

[dependencies]
serde = {{ version = "1", features = ["derive"] }}
serde_json = "1"
{dependency}

# A workspace of its own: this project builds alone, wherever it lives.
[workspace]

# Components are shipped to servers: small and fast. Function names stay
# (strip only debug info), so a failure's backtrace names your functions.
[profile.release]
opt-level = "s"
lto = true
codegen-units = 1
strip = "debuginfo"
panic = "abort"
"#,
        dependency = sdk.dependency()
    );
    let config =
        "# `cargo build --release` builds the component.\n[build]\ntarget = \"wasm32-wasip2\"\n";
    let lib = format!(
        r#"//! The {name} processor: folds its stream into a state.
//!
//! The state is stored as JSON after every batch and handed back to the next
//! one; `fold` sees one event at a time, in offset order. Keep it
//! deterministic: the same events must give the same state.
//!
//! Keep the JSON state small: it travels whole on every wake. Per-entity
//! data (a balance per account, a record per order) belongs in keyed
//! state, which a wake reads and writes key by key, however many keys
//! there are, and which commits with the state:
//!
//! ```ignore
//! use streamhost_guest::keyed::Map;
//! // Totals per customer under "total/<customer>", values as JSON.
//! const TOTALS: Map<f64> = Map::new("total/");
//! // in fold:
//! let before = TOTALS.get(&customer)?.unwrap_or(0.0);
//! TOTALS.set(&customer, &(before + amount))?;
//! ```
//!
//! `streamhost keys STREAM {name}` lists the keys of a deployed instance;
//! `streamhost fold ... --keys FILE --keys-out FILE` folds with keys
//! offline.

use std::collections::BTreeMap;

use serde::{{Deserialize, Serialize}};
use streamhost_guest::{{Context, Event, Failure, Processor}};

/// What the processor knows. `#[serde(default)]`: a state written by an
/// older version (with fewer fields) still loads.
#[derive(Debug, Default, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct State {{
    /// Events folded.
    pub events: u64,
    /// Events by type.
    pub by_type: BTreeMap<String, u64>,
    /// The sum of every numeric `payload.amount`.
    pub total: f64,
    /// The offset of the last event folded.
    pub last_offset: u64,
}}

pub struct {type_name};

impl Processor for {type_name} {{
    type State = State;
    const SLUG: &'static str = "{name}";
    const VERSION: &'static str = "0.1.0";
    /// Event types to fold; empty means every type but the platform's own
    /// (`events.iterate.com/...`; set `PLATFORM_EVENTS = true` for those).
    const CONSUMES: &'static [&'static str] = &[];

    fn fold(state: &mut State, event: &Event, _ctx: &mut Context) -> Result<(), Failure> {{
        state.events += 1;
        *state.by_type.entry(event.event_type.clone()).or_default() += 1;
        if let Some(amount) = event.payload.get("amount") {{
            state.total += amount.as_f64().ok_or_else(|| {{
                Failure::fatal(format!(
                    "payload.amount of the event at offset {{}} is not a number: {{amount}}",
                    event.offset
                ))
            }})?;
        }}
        state.last_offset = event.offset;
        Ok(())
    }}
}}

streamhost_guest::processor!({type_name});
"#
    );
    let readme = format!(
        r#"# {name}

A streamhost processor: `src/lib.rs` folds a stream's
events into a state (events by type, the sum of `payload.amount`).

Build (the project targets `wasm32-wasip2`; `rustup target add
wasm32-wasip2` once):

```sh
cargo build --release
```

The component is `target/wasm32-wasip2/release/{krate}.wasm`. Fold the
sample offline, no server needed:

```sh
streamhost fold target/wasm32-wasip2/release/{krate}.wasm --events events.jsonl
```

Test it: the fold over the sample must end in `expected.json`, without a
trap, the same on a second run and whatever the batch cuts (as the server
cuts batches while events arrive); a failure prints the batch that went
wrong and a `wasmtime` command that replays it:

```sh
streamhost test target/wasm32-wasip2/release/{krate}.wasm --events events.jsonl --expect expected.json
```

Run it on a server (`streamhost serve` in another terminal): deploy it,
subscribe it to a stream, append, and read its state:

```sh
streamhost deploy --project acme {name} target/wasm32-wasip2/release/{krate}.wasm
streamhost subscribe --project acme /payments {name} --wake {name}
streamhost append --project acme /payments --type events.example/payment-received --payload '{{"amount": 30}}'
streamhost processor --project acme /payments {name} --wait
```

Change the fold, build, deploy again: the next wake uses the new version
from the processor's checkpoint (`streamhost deploy --refold` folds the
whole stream again instead). `streamhost verify --project acme /payments
{name}` refolds from offset 0 and compares with the stored state.
"#
    );
    vec![
        ("Cargo.toml", cargo),
        (".cargo/config.toml", config.to_string()),
        ("src/lib.rs", lib),
        ("events.jsonl", SAMPLE.to_string()),
        ("expected.json", EXPECTED.to_string()),
        ("README.md", readme),
        (".gitignore", "/target\n".to_string()),
    ]
}

/// The `Cargo.lock` a new Rust project starts with when its SDK is a
/// checkout's `guest-sdk/`: the versions that checkout's example guests
/// are built and tested with (`examples/processors/Cargo.lock`), so its
/// first build resolves nothing anew. None without that file, or (with a
/// warning) when it does not lock what the project uses: cargo then
/// resolves the versions itself, as without a checkout.
fn checkout_lock(sdk: &Sdk) -> Option<String> {
    let Sdk::Path(path) = sdk else {
        return None;
    };
    let lock = path.join("../examples/processors/Cargo.lock");
    let text = std::fs::read_to_string(&lock).ok()?;
    match pinned_lock(&text, &["serde", "serde_json", "streamhost-guest"]) {
        Ok(pinned) => Some(pinned),
        Err(e) => {
            tracing::warn!(
                lock = %lock.display(),
                error = %format!("{e:#}"),
                "the new project gets no Cargo.lock"
            );
            None
        }
    }
}

/// One package of a `Cargo.lock`.
#[derive(serde::Deserialize, serde::Serialize)]
struct LockedPackage {
    name: String,
    version: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    source: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    checksum: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    dependencies: Vec<String>,
}

#[derive(serde::Deserialize, serde::Serialize)]
struct LockFile {
    version: u32,
    package: Vec<LockedPackage>,
}

/// The packages of lock file `text` that `roots` (package names) depend
/// on, directly or not, as a lock file of their own (cargo adds the
/// project's own entry at its first build). A dependency is named in a
/// lock as `name` when one version is locked, else as `name version`.
fn pinned_lock(text: &str, roots: &[&str]) -> Result<String> {
    let lock: LockFile = toml::from_str(text)?;
    let find = |spec: &str| -> Result<usize> {
        let mut parts = spec.split(' ');
        let name = parts.next().unwrap_or_default();
        let version = parts.next();
        let found: Vec<usize> = lock
            .package
            .iter()
            .enumerate()
            .filter(|(_, p)| p.name == name && version.is_none_or(|v| p.version == v))
            .map(|(i, _)| i)
            .collect();
        match found[..] {
            [i] => Ok(i),
            [] => bail!("no package {spec:?} is locked"),
            _ => bail!("{} versions of {name:?} are locked", found.len()),
        }
    };
    let mut keep = vec![false; lock.package.len()];
    let mut next: Vec<usize> = roots.iter().map(|r| find(r)).collect::<Result<_>>()?;
    while let Some(i) = next.pop() {
        if !std::mem::replace(&mut keep[i], true) {
            for dep in &lock.package[i].dependencies {
                next.push(find(dep)?);
            }
        }
    }
    let package = lock
        .package
        .into_iter()
        .zip(keep)
        .filter_map(|(p, k)| k.then_some(p))
        .collect();
    let pinned = toml::to_string(&LockFile {
        version: lock.version,
        package,
    })?;
    Ok(format!(
        "# The versions the streamhost checkout's example guests are built with;\n\
         # cargo adds this project and keeps this file up to date.\n{pinned}"
    ))
}

/// Writes a new processor project into `dir` (which must not exist or be
/// empty); answers what it wrote.
pub fn write(dir: &Path, lang: Lang, name: &str, sdk: &Sdk) -> Result<Vec<PathBuf>> {
    validate_name(name)?;
    if dir.exists()
        && std::fs::read_dir(dir)
            .with_context(|| format!("reading {}", dir.display()))?
            .next()
            .is_some()
    {
        bail!(
            "{} exists and is not empty: choose another --dir",
            dir.display()
        );
    }
    let mut files = files(lang, name, sdk);
    if lang == Lang::Rust {
        if let Some(lock) = checkout_lock(sdk) {
            files.push(("Cargo.lock", lock));
        }
    }
    let mut written = Vec::new();
    for (rel, content) in files {
        let path = dir.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating {}", parent.display()))?;
        }
        std::fs::write(&path, content).with_context(|| format!("writing {}", path.display()))?;
        written.push(path);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pinned_lock_holds_what_the_roots_depend_on_and_nothing_else() {
        let lock = r#"
version = 4

[[package]]
name = "counter"
version = "0.1.0"
dependencies = ["serde", "streamhost-guest"]

[[package]]
name = "serde"
version = "1.0.229"
source = "registry+https://github.com/rust-lang/crates.io-index"
checksum = "aa"
dependencies = ["syn 2.0.119"]

[[package]]
name = "streamhost-guest"
version = "0.1.0"
dependencies = ["serde", "wit-bindgen"]

[[package]]
name = "syn"
version = "1.0.109"
source = "registry+https://github.com/rust-lang/crates.io-index"

[[package]]
name = "syn"
version = "2.0.119"
source = "registry+https://github.com/rust-lang/crates.io-index"

[[package]]
name = "wit-bindgen"
version = "0.46.0"
source = "registry+https://github.com/rust-lang/crates.io-index"
"#;
        let pinned = pinned_lock(lock, &["serde", "streamhost-guest"]).unwrap();
        let parsed: LockFile = toml::from_str(&pinned).unwrap();
        assert_eq!(parsed.version, 4);
        let kept: Vec<String> = parsed
            .package
            .iter()
            .map(|p| format!("{} {}", p.name, p.version))
            .collect();
        assert_eq!(
            kept,
            [
                "serde 1.0.229",
                "streamhost-guest 0.1.0",
                "syn 2.0.119",
                "wit-bindgen 0.46.0"
            ],
            "{pinned}"
        );
        assert_eq!(parsed.package[0].checksum.as_deref(), Some("aa"));
        // A dependency the lock does not hold is an error naming it.
        let e = pinned_lock(lock, &["tokio"]).unwrap_err().to_string();
        assert!(e.contains("\"tokio\""), "{e}");
        let e = pinned_lock(lock, &["syn"]).unwrap_err().to_string();
        assert!(e.contains("2 versions of \"syn\""), "{e}");
    }

    #[test]
    fn names_are_component_names() {
        for good in ["payments", "order-totals", "a1"] {
            validate_name(good).unwrap();
        }
        for bad in ["", "Payments", "1st", "a_b", "a-", &"x".repeat(64)] {
            let e = validate_name(bad).unwrap_err().to_string();
            assert!(e.contains(&format!("{bad:?}")), "{e}");
        }
    }

    #[test]
    fn the_project_names_its_crate_type_and_sdk() {
        let files = processor_files(
            "order-totals",
            &Sdk::Git("https://example.com/sh.git".into()),
        );
        let get = |p: &str| files.iter().find(|(f, _)| *f == p).unwrap().1.clone();
        assert!(get("Cargo.toml").contains("name = \"order-totals\""));
        assert!(get("Cargo.toml")
            .contains(r#"streamhost-guest = { git = "https://example.com/sh.git" }"#));
        assert!(get("src/lib.rs").contains("pub struct OrderTotals;"));
        assert!(get("src/lib.rs").contains("processor!(OrderTotals)"));
        assert!(
            get("src/lib.rs").contains("keyed::Map"),
            "the template shows keyed state"
        );
        assert!(get("README.md").contains("release/order_totals.wasm"));
        assert!(get(".cargo/config.toml").contains("wasm32-wasip2"));
    }

    #[test]
    fn every_language_has_its_sdk_its_build_and_the_shared_fixture() {
        let sdk = |dir: &str| Sdk::Path(PathBuf::from(format!("/src/streamhost/{dir}")));
        let cases = [
            (
                Lang::Ts,
                "guest-sdk/js",
                "package.json",
                "\"@streamhost/guest\": \"file:/src/streamhost/guest-sdk/js\"",
                "npm run build",
            ),
            (
                Lang::Js,
                "guest-sdk/js",
                "package.json",
                "\"@streamhost/guest\": \"file:/src/streamhost/guest-sdk/js\"",
                "npm run build",
            ),
            (
                Lang::Python,
                "guest-sdk/python",
                "requirements.txt",
                "streamhost-guest @ file:///src/streamhost/guest-sdk/python",
                "python -m streamhost_guest build processor -o pay-me.wasm",
            ),
        ];
        for (lang, dir, manifest, dependency, build) in cases {
            let files = files(lang, "pay-me", &sdk(dir));
            let get = |name: &str| {
                files
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, c)| c.clone())
                    .unwrap_or_else(|| panic!("{lang:?}: no {name}"))
            };
            assert!(
                get(manifest).contains(dependency),
                "{lang:?}: {}",
                get(manifest)
            );
            assert!(get("README.md").contains(build), "{lang:?}");
            assert!(lang.next_steps("pay-me").contains(build), "{lang:?}");
            assert_eq!(get("events.jsonl"), SAMPLE);
            assert_eq!(get("expected.json"), EXPECTED);
        }
        let ts = files(Lang::Ts, "pay-me", &sdk("guest-sdk/js"));
        assert!(ts
            .iter()
            .any(|(n, c)| *n == "src/processor.ts" && c.contains("defineProcessor<State>")));
        assert!(ts.iter().any(|(n, _)| *n == "tsconfig.json"));
        let js = files(Lang::Js, "pay-me", &sdk("guest-sdk/js"));
        assert!(js
            .iter()
            .any(|(n, c)| *n == "src/processor.js" && !c.contains("interface State")));
        assert!(js.iter().all(|(n, _)| *n != "tsconfig.json"));
        let git = files(
            Lang::Python,
            "pay-me",
            &Sdk::Git("https://example.com/streamhost.git".into()),
        );
        assert!(git.iter().any(|(n, c)| *n == "requirements.txt"
            && c.contains("git+https://example.com/streamhost.git#subdirectory=guest-sdk/python")));
    }

    #[test]
    fn every_sdks_wit_is_the_repositorys() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        for sdk in [
            "guest-sdk/wit",
            "guest-sdk/js/wit",
            "guest-sdk/python/streamhost_guest/wit",
        ] {
            for file in ["processor.wit", "deps/keyvalue/keyvalue.wit"] {
                let canonical = std::fs::read_to_string(root.join("wit").join(file)).unwrap();
                let vendored = std::fs::read_to_string(root.join(sdk).join(file))
                    .unwrap_or_else(|e| panic!("{sdk}/{file}: {e}"));
                assert!(
                    canonical == vendored,
                    "{sdk}/{file} differs from wit/{file}: copy it over"
                );
            }
        }
    }
}
