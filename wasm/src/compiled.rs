//! The compiled-component files on disk (`{cache-dir}/{digest}-{engine}.cwasm`).
//!
//! A compiled component is native code that wasmtime maps and runs as it is,
//! so a file is loaded only after it is shown to be exactly what this engine
//! wrote: a header names the format, the engine (its compatibility key), the
//! payload's length and its SHA-256, and the payload must match all of them.
//! A file that does not (truncated by a crash, a flipped bit, another
//! engine's) is never deserialized: the caller compiles again and replaces it.
//! Files are written to a temporary file of their own, fsynced, renamed into
//! place and the directory fsynced, so a crash leaves the old file, the new
//! one or none, never part of one.

use std::io::Write;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// The first bytes of every compiled-component file (the format's version
/// is its last byte).
const MAGIC: &[u8; 8] = b"SHCWASM\x01";
/// Bytes of the engine key field (the key, zero-padded).
const ENGINE_KEY_BYTES: usize = 32;
/// Bytes of the header before the payload: magic, engine key, payload
/// length (u64, little-endian), payload SHA-256.
pub const HEADER_BYTES: usize = MAGIC.len() + ENGINE_KEY_BYTES + 8 + 32;

/// Why a file on disk is not loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Defect {
    /// Shorter than its header, or than the length its header gives.
    Truncated { expected: u64, found: u64 },
    /// Not a file of this format (or of another version of it).
    NotACompiledComponent,
    /// Written by another engine configuration.
    OtherEngine { found: String },
    /// The payload's SHA-256 differs from the header's.
    ChecksumMismatch,
    /// Longer than its header says.
    TrailingBytes { expected: u64, found: u64 },
}

impl std::fmt::Display for Defect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Defect::Truncated { expected, found } => {
                write!(f, "truncated: {found} bytes where {expected} were written")
            }
            Defect::NotACompiledComponent => write!(f, "not a compiled-component file"),
            Defect::OtherEngine { found } => write!(f, "compiled by another engine ({found})"),
            Defect::ChecksumMismatch => write!(f, "its SHA-256 does not match its header"),
            Defect::TrailingBytes { expected, found } => {
                write!(f, "{found} bytes where {expected} were written")
            }
        }
    }
}

/// The file's bytes: header, then `payload` (what `Component::serialize`
/// wrote). `engine` is at most 32 bytes (the runtime's compatibility key).
pub fn encode(engine: &str, payload: &[u8]) -> Vec<u8> {
    assert!(
        engine.len() <= ENGINE_KEY_BYTES,
        "an engine key of {engine:?}"
    );
    let mut out = Vec::with_capacity(HEADER_BYTES + payload.len());
    out.extend_from_slice(MAGIC);
    let mut key = [0u8; ENGINE_KEY_BYTES];
    key[..engine.len()].copy_from_slice(engine.as_bytes());
    out.extend_from_slice(&key);
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(&Sha256::digest(payload));
    out.extend_from_slice(payload);
    out
}

/// The payload of a file's bytes, once its header shows it whole, of
/// `engine` and unchanged.
pub fn decode<'a>(engine: &str, file: &'a [u8]) -> Result<&'a [u8], Defect> {
    if file.len() < HEADER_BYTES {
        return if file.starts_with(&MAGIC[..file.len().min(MAGIC.len())]) {
            Err(Defect::Truncated {
                expected: HEADER_BYTES as u64,
                found: file.len() as u64,
            })
        } else {
            Err(Defect::NotACompiledComponent)
        };
    }
    let (magic, rest) = file.split_at(MAGIC.len());
    if magic != MAGIC {
        return Err(Defect::NotACompiledComponent);
    }
    let (key, rest) = rest.split_at(ENGINE_KEY_BYTES);
    let key_len = key.iter().position(|b| *b == 0).unwrap_or(ENGINE_KEY_BYTES);
    if &key[..key_len] != engine.as_bytes() || key[key_len..].iter().any(|b| *b != 0) {
        return Err(Defect::OtherEngine {
            found: String::from_utf8_lossy(&key[..key_len]).into_owned(),
        });
    }
    let (length, rest) = rest.split_at(8);
    let length = u64::from_le_bytes(length.try_into().expect("8 bytes"));
    let (checksum, payload) = rest.split_at(32);
    let expected = HEADER_BYTES as u64 + length;
    let found = file.len() as u64;
    if found < expected {
        return Err(Defect::Truncated { expected, found });
    }
    if found > expected {
        return Err(Defect::TrailingBytes { expected, found });
    }
    if Sha256::digest(payload).as_slice() != checksum {
        return Err(Defect::ChecksumMismatch);
    }
    Ok(payload)
}

/// Reads `path` and answers its payload, or why it may not be loaded
/// (`Ok(None)`: no such file).
pub fn read(path: &Path, engine: &str) -> std::io::Result<Option<Result<Vec<u8>, Defect>>> {
    let file = match std::fs::read(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    Ok(Some(decode(engine, &file).map(<[u8]>::to_vec)))
}

/// Writes `payload` to `path` durably: a temporary file of this call's own
/// beside it (so concurrent writers never rename each other's half-written
/// files), fsynced, renamed into place, the directory fsynced.
pub fn write(path: &Path, engine: &str, payload: &[u8]) -> std::io::Result<()> {
    let tmp = unique_temp_path(path);
    let written = (|| {
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(&encode(engine, payload))?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)?;
        if let Some(dir) = path.parent() {
            std::fs::File::open(dir)?.sync_all()?;
        }
        Ok(())
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// A temporary path beside `path`, unique to this process and call.
pub fn unique_temp_path(path: &Path) -> PathBuf {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    path.with_extension(format!("{}.{n}.tmp", std::process::id()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ENGINE: &str = "0123456789abcdef";

    #[test]
    fn what_encode_writes_decode_reads_back() {
        for payload in [&b""[..], b"x", &[7u8; 4096]] {
            let file = encode(ENGINE, payload);
            assert_eq!(file.len(), HEADER_BYTES + payload.len());
            assert_eq!(decode(ENGINE, &file), Ok(payload));
        }
    }

    #[test]
    fn every_truncation_is_refused() {
        let file = encode(ENGINE, b"compiled code");
        for len in 0..file.len() {
            let got = decode(ENGINE, &file[..len]);
            assert!(
                matches!(got, Err(Defect::Truncated { .. })),
                "{len} of {} bytes: {got:?}",
                file.len()
            );
        }
    }

    #[test]
    fn every_flipped_bit_is_refused() {
        let file = encode(ENGINE, b"compiled code");
        for byte in 0..file.len() {
            for bit in 0..8 {
                let mut flipped = file.clone();
                flipped[byte] ^= 1 << bit;
                assert!(decode(ENGINE, &flipped).is_err(), "byte {byte} bit {bit}");
            }
        }
    }

    #[test]
    fn another_engines_file_and_plain_wasmtime_output_are_refused() {
        let file = encode("fedcba9876543210", b"code");
        assert_eq!(
            decode(ENGINE, &file),
            Err(Defect::OtherEngine {
                found: "fedcba9876543210".into()
            })
        );
        // What earlier versions wrote: `Component::serialize` bytes alone.
        assert_eq!(
            decode(ENGINE, &[0x7f, b'E', b'L', b'F', 2, 1, 1, 0].repeat(20)),
            Err(Defect::NotACompiledComponent)
        );
        let mut longer = encode(ENGINE, b"code");
        longer.push(0);
        assert!(matches!(
            decode(ENGINE, &longer),
            Err(Defect::TrailingBytes { .. })
        ));
    }

    #[test]
    fn a_written_file_reads_back_and_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("abc-0123.cwasm");
        assert_eq!(read(&path, ENGINE).unwrap(), None);
        write(&path, ENGINE, b"compiled").unwrap();
        assert_eq!(read(&path, ENGINE).unwrap(), Some(Ok(b"compiled".to_vec())));
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["abc-0123.cwasm"]);
    }

    #[test]
    fn temp_files_are_unique_per_call_and_beside_the_target() {
        let path = Path::new("/cache/abc-0123.cwasm");
        let a = unique_temp_path(path);
        let b = unique_temp_path(path);
        assert_ne!(a, b);
        assert_eq!(a.parent(), path.parent());
        assert!(a.to_str().unwrap().ends_with(".tmp"));
    }
}
