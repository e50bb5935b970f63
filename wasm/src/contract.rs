//! What a component asks of the host, read from the names of its outer
//! imports and exports before anything is compiled: an import the host does
//! not give, or a processor or reactor built against another version of
//! `wit/`, is refused at once (a 12–18 MiB JavaScript or Python component
//! would otherwise compile for seconds first), in the author's terms.

use wasmparser::component_types::ComponentEntityType;
use wasmparser::{Parser, Payload, Validator, WasmFeatures};

/// The interface packages the host links (wasmtime-wasi's WASI 0.2, and
/// `wasi:keyvalue`'s `store` and `batch`).
const GIVEN: &[&str] = &[
    "wasi:cli",
    "wasi:clocks",
    "wasi:filesystem",
    "wasi:io",
    "wasi:random",
    "wasi:sockets",
    "wasi:keyvalue",
];

/// The package of the processor and reactor interfaces.
const PACKAGE: &str = "streamhost:processor";

/// The version of `streamhost:processor` in `wit/`, which the SDKs build
/// against.
pub const VERSION: &str = "0.3.0";

/// The versions of `streamhost:processor` this host runs: the current one,
/// and 0.2.0 (no time, no processor effect envelope), whose components run
/// unchanged.
pub const VERSIONS: &[&str] = &["0.2.0", VERSION];

/// The interface names of a component's outer imports and exports.
#[derive(Debug, Default, PartialEq)]
pub struct Interfaces {
    pub imports: Vec<String>,
    pub exports: Vec<String>,
}

/// Reads the outer import and export names (those of nested modules and
/// components are the component's own business). `None` when the bytes do
/// not parse as far as that: compiling them says what is wrong.
pub fn interfaces(bytes: &[u8]) -> Option<Interfaces> {
    let mut found = Interfaces::default();
    // Depth 1 is the outer component; each nested module or component
    // starts with its own `Version` and ends with its own `End`.
    let mut depth = 0usize;
    for payload in Parser::new(0).parse_all(bytes) {
        match payload.ok()? {
            Payload::Version { .. } => depth += 1,
            Payload::End(_) => depth = depth.saturating_sub(1),
            Payload::ComponentImportSection(section) if depth == 1 => {
                for import in section {
                    found.imports.push(import.ok()?.name.name.to_string());
                }
            }
            Payload::ComponentExportSection(section) if depth == 1 => {
                for export in section {
                    found.exports.push(export.ok()?.name.name.to_string());
                }
            }
            _ => {}
        }
    }
    Some(found)
}

/// What the host's engine accepts: wasmtime's on-by-default set
/// (WebAssembly 3.0) with the component model, less what this build of
/// wasmtime leaves out (GC types and exceptions come with its `gc` feature,
/// threads with `threads`).
fn features() -> WasmFeatures {
    (WasmFeatures::WASM3 | WasmFeatures::COMPONENT_MODEL)
        & !(WasmFeatures::GC_TYPES | WasmFeatures::EXCEPTIONS | WasmFeatures::THREADS)
}

/// Validates `bytes` as a component, every function body included, without
/// compiling anything (a fraction of a second where compiling a 12–18 MiB
/// JavaScript or Python component takes seconds), and answers the names of
/// the functions it exports: at its top level and in the instances it
/// exports, in order, as a deploy lists them.
pub fn exported_functions(bytes: &[u8]) -> Result<Vec<String>, String> {
    let types = Validator::new_with_features(features())
        .validate_all(bytes)
        .map_err(|e| e.to_string())?;
    let types = types.as_ref();
    let names = interfaces(bytes).map(|i| i.exports).unwrap_or_default();
    let mut functions = Vec::new();
    for name in &names {
        match types.component_item_for_export(name).map(|item| &item.ty) {
            Some(ComponentEntityType::Func(_)) => functions.push(name.clone()),
            Some(ComponentEntityType::Instance(id)) => {
                for (function, item) in &types[*id].exports {
                    if matches!(item.ty, ComponentEntityType::Func(_)) {
                        functions.push(function.clone());
                    }
                }
            }
            _ => {}
        }
    }
    Ok(functions)
}

/// `namespace:package` of an interface name (`wasi:http/types@0.2.3` →
/// `wasi:http`), if it is one.
fn package_of(name: &str) -> Option<&str> {
    let (package, _) = name.split_once('/')?;
    package.contains(':').then_some(package)
}

/// The version after `@`, if any.
fn version_of(name: &str) -> Option<&str> {
    name.rsplit_once('@').map(|(_, v)| v)
}

/// Refuses what no build of the host could run: an import of a package the
/// host does not give (named, with what it gives and how the SDKs' builds
/// avoid it), a `streamhost:processor` interface of another version.
pub fn check(found: &Interfaces) -> Result<(), String> {
    let missing: Vec<&str> = found
        .imports
        .iter()
        .map(String::as_str)
        .filter(|name| package_of(name).is_none_or(|p| !GIVEN.contains(&p)))
        .collect();
    if !missing.is_empty() {
        let http = missing
            .iter()
            .any(|name| package_of(name) == Some("wasi:http"));
        return Err(format!(
            "the component imports {}, which the host does not give: a guest may import only WASI 0.2 \
             (cli, clocks, filesystem, io, random, sockets) and wasi:keyvalue (store, batch){}",
            quoted(&missing),
            if http {
                ". A fold has no network: componentize-js adds wasi:http unless it is built with \
                 `disableFeatures: [\"http\", \"fetch-event\"]` (the SDK's build and `streamhost new` do)"
            } else {
                ""
            }
        ));
    }
    let ours: Vec<&str> = found
        .imports
        .iter()
        .chain(&found.exports)
        .map(String::as_str)
        .filter(|name| package_of(name) == Some(PACKAGE))
        .collect();
    let other: Vec<&str> = ours
        .iter()
        .copied()
        .filter(|name| version_of(name).is_none_or(|v| !VERSIONS.contains(&v)))
        .collect();
    if let Some(first) = other.first() {
        return Err(format!(
            "the component was built against {first}, and this host runs {PACKAGE}@{VERSION} \
             (and @0.2.0): build it again against this host's wit/ (the SDKs of this release \
             carry it)"
        ));
    }
    let mut versions: Vec<&str> = ours.iter().filter_map(|name| version_of(name)).collect();
    versions.sort_unstable();
    versions.dedup();
    if versions.len() > 1 {
        return Err(format!(
            "the component exports {} (versions {} of {PACKAGE}): a component is built against \
             one version of wit/; build it again against this host's ({VERSION})",
            quoted(&ours),
            versions.join(" and ")
        ));
    }
    Ok(())
}

fn quoted(names: &[&str]) -> String {
    let quoted: Vec<String> = names.iter().map(|n| format!("`{n}`")).collect();
    quoted.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(imports: &[&str], exports: &[&str]) -> Interfaces {
        Interfaces {
            imports: imports.iter().map(|s| s.to_string()).collect(),
            exports: exports.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn wasi_keyvalue_and_any_export_of_this_version_pass() {
        let found = of(
            &[
                "wasi:cli/stderr@0.2.3",
                "wasi:io/streams@0.2.3",
                "wasi:keyvalue/store@0.2.0-draft",
                "wasi:sockets/tcp@0.2.0",
            ],
            &[
                "streamhost:processor/processor@0.2.0",
                "example:math/calc@1.0.0",
                "plain",
            ],
        );
        assert_eq!(check(&found), Ok(()));
    }

    #[test]
    fn an_import_the_host_does_not_give_is_named_with_the_cure_for_wasi_http() {
        let found = of(
            &["wasi:io/poll@0.2.3", "wasi:http/outgoing-handler@0.2.3"],
            &[],
        );
        let e = check(&found).unwrap_err();
        assert!(
            e.contains("imports `wasi:http/outgoing-handler@0.2.3`, which the host does not give"),
            "{e}"
        );
        assert!(e.contains("disableFeatures"), "{e}");
        let e = check(&of(&["acme:billing/charge@1.0.0", "logger"], &[])).unwrap_err();
        assert!(e.contains("`acme:billing/charge@1.0.0`, `logger`"), "{e}");
        assert!(!e.contains("disableFeatures"), "{e}");
    }

    #[test]
    fn another_version_of_the_processor_package_names_both_versions() {
        let e = check(&of(&[], &["streamhost:processor/processor@0.1.0"])).unwrap_err();
        assert!(
            e.contains("built against streamhost:processor/processor@0.1.0, and this host runs streamhost:processor@0.3.0 (and @0.2.0)"),
            "{e}"
        );
        let e = check(&of(&[], &["streamhost:processor/reactor"])).unwrap_err();
        assert!(
            e.contains("built against streamhost:processor/reactor,"),
            "{e}"
        );
    }

    #[test]
    fn both_versions_pass_alone_and_a_component_exporting_both_is_refused() {
        for version in VERSIONS {
            let found = of(
                &[],
                &[
                    &format!("streamhost:processor/processor@{version}"),
                    &format!("streamhost:processor/reactor@{version}"),
                ],
            );
            assert_eq!(check(&found), Ok(()), "{version}");
        }
        let e = check(&of(
            &[],
            &[
                "streamhost:processor/processor@0.2.0",
                "streamhost:processor/reactor@0.3.0",
            ],
        ))
        .unwrap_err();
        assert!(
            e.contains("versions 0.2.0 and 0.3.0 of streamhost:processor): a component is built against one version"),
            "{e}"
        );
    }

    #[test]
    fn the_version_is_the_one_the_bindings_export() {
        for interface in [
            crate::runtime::PROCESSOR_INTERFACE,
            crate::runtime::REACTOR_INTERFACE,
        ] {
            assert_eq!(version_of(interface), Some(VERSION), "{interface}");
            assert_eq!(package_of(interface), Some(PACKAGE), "{interface}");
        }
    }

    /// The Rust guests of `examples/processors`, when they are built.
    fn built_guests() -> Vec<(String, Vec<u8>)> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../examples/processors/target/wasm32-wasip2/release");
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return Vec::new();
        };
        entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "wasm"))
            .map(|p| (p.display().to_string(), std::fs::read(&p).unwrap()))
            .collect()
    }

    #[test]
    fn exports_read_without_compiling_are_the_compiled_components() {
        let guests = built_guests();
        if guests.is_empty() {
            // `scripts/test` and CI build them before the tests.
            eprintln!("the Rust guests are not built: nothing to compare");
            return;
        }
        let cache = tempfile::tempdir().unwrap();
        let runtime = crate::runtime::Runtime::new(cache.path().into()).unwrap();
        for (path, bytes) in guests {
            let (compiled, _) = runtime.validate(&bytes).unwrap();
            assert_eq!(exported_functions(&bytes), Ok(compiled), "{path}");
        }
    }

    #[test]
    fn a_function_body_that_does_not_validate_is_named() {
        // A component whose core module's function returns an i64 where
        // its type says i32.
        let bytes = wat_component();
        let e = exported_functions(&bytes).unwrap_err();
        assert!(e.contains("type mismatch"), "{e}");
    }

    /// `(component (core module (func (result i32) i64.const 0)))`, by hand.
    fn wat_component() -> Vec<u8> {
        let module: &[u8] = &[
            0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00, // core module header
            0x01, 0x05, 0x01, 0x60, 0x00, 0x01, 0x7f, // type: () -> i32
            0x03, 0x02, 0x01, 0x00, // function 0 of type 0
            0x0a, 0x06, 0x01, 0x04, 0x00, 0x42, 0x00, 0x0b, // body: i64.const 0
        ];
        let mut bytes = vec![0x00, 0x61, 0x73, 0x6d, 0x0d, 0x00, 0x01, 0x00];
        bytes.push(0x01); // core module section
        bytes.push(module.len() as u8);
        bytes.extend_from_slice(module);
        bytes
    }

    #[test]
    fn bytes_that_do_not_parse_read_as_nothing() {
        assert_eq!(interfaces(b"\0asm\x0d\0\x01\0garbage"), None);
    }
}
