//! Stream addresses: a namespace (a project, or the deployment-wide global
//! namespace) and a canonical path.

use std::fmt;

use crate::error::Error;

/// Longest canonical stream path, in bytes.
pub const PATH_BYTES_MAX: usize = 512;

/// Where a stream lives.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Namespace {
    /// A project's streams.
    Project(String),
    /// The deployment-wide streams.
    Global,
}

impl Namespace {
    /// Validates a project name against `[a-z0-9][a-z0-9-]{0,62}`.
    pub fn project(name: &str) -> Result<Namespace, Error> {
        validate_project(name)?;
        Ok(Namespace::Project(name.to_string()))
    }

    /// The project id, `None` for the global namespace.
    pub fn project_id(&self) -> Option<&str> {
        match self {
            Namespace::Project(p) => Some(p),
            Namespace::Global => None,
        }
    }

    /// The key used in storage: the project name, or `""` for global.
    pub fn storage_key(&self) -> &str {
        self.project_id().unwrap_or("")
    }

    /// The namespace of a storage key (the inverse of [`Namespace::storage_key`]).
    pub fn from_storage_key(key: &str) -> Namespace {
        if key.is_empty() {
            Namespace::Global
        } else {
            Namespace::Project(key.to_string())
        }
    }
}

/// Checks a project name: `[a-z0-9][a-z0-9-]{0,62}`.
pub fn validate_project(name: &str) -> Result<(), Error> {
    let bytes = name.as_bytes();
    let ok = !bytes.is_empty()
        && bytes.len() <= 63
        && (bytes[0].is_ascii_lowercase() || bytes[0].is_ascii_digit())
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-');
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "project name {name:?} is invalid: it must match [a-z0-9][a-z0-9-]{{0,62}}"
        )))
    }
}

/// A stream's full address.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamAddress {
    /// The project, or global.
    pub namespace: Namespace,
    /// Canonical path: starts with `/`, no empty, `.` or `..` segments, no
    /// trailing `/` (except the root `/`).
    pub path: String,
}

impl StreamAddress {
    /// Builds an address from a raw path, canonicalizing it.
    pub fn new(namespace: Namespace, raw_path: &str) -> Result<StreamAddress, Error> {
        Ok(StreamAddress {
            namespace,
            path: canonicalize_path(raw_path)?,
        })
    }
}

impl fmt::Display for StreamAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.namespace {
            Namespace::Project(p) => write!(f, "{p}:{}", self.path),
            Namespace::Global => write!(f, "global:{}", self.path),
        }
    }
}

fn segment_char_ok(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'~' | b'-')
}

/// Canonicalizes a stream path: `//` collapsed, `.` and `..` resolved, the
/// trailing `/` dropped. A path must start with `/`, its segments must match
/// `[A-Za-z0-9._~-]+`, `..` may not climb above the root, and the result is at
/// most [`PATH_BYTES_MAX`] bytes.
///
/// ```
/// use streamhost_core::stream::canonicalize_path;
/// assert_eq!(canonicalize_path("/a/./b/../c/").unwrap(), "/a/c");
/// assert!(canonicalize_path("/a/../../b").is_err());
/// ```
pub fn canonicalize_path(raw: &str) -> Result<String, Error> {
    if !raw.starts_with('/') {
        return Err(Error::invalid(format!(
            "stream path {raw:?} must start with \"/\""
        )));
    }
    let mut segments: Vec<&str> = Vec::new();
    for segment in raw.split('/') {
        match segment {
            "" | "." => {}
            ".." => {
                if segments.pop().is_none() {
                    return Err(Error::invalid(format!(
                        "stream path {raw:?} climbs above the root with \"..\""
                    )));
                }
            }
            s => {
                if !s.bytes().all(segment_char_ok) {
                    return Err(Error::invalid(format!(
                        "stream path segment {s:?} in {raw:?} is invalid: segments match [A-Za-z0-9._~-]+"
                    )));
                }
                segments.push(s);
            }
        }
    }
    let path = format!("/{}", segments.join("/"));
    if path.len() > PATH_BYTES_MAX {
        return Err(Error::invalid(format!(
            "stream path is {} bytes, over the {PATH_BYTES_MAX}-byte limit",
            path.len()
        )));
    }
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_forms() {
        assert_eq!(canonicalize_path("/").unwrap(), "/");
        assert_eq!(canonicalize_path("//a//b/").unwrap(), "/a/b");
        assert_eq!(canonicalize_path("/a/./b/../c").unwrap(), "/a/c");
        assert_eq!(canonicalize_path("/a/..").unwrap(), "/");
        assert_eq!(canonicalize_path("/x.y_z~-1/...").unwrap(), "/x.y_z~-1/...");
    }

    #[test]
    fn rejections_name_the_value() {
        let e = canonicalize_path("/a/../../b").unwrap_err();
        assert!(e.message.contains("/a/../../b"), "{}", e.message);
        let e = canonicalize_path("/a/b:c").unwrap_err();
        assert!(e.message.contains("\"b:c\""), "{}", e.message);
        assert!(canonicalize_path("a").is_err());
        assert!(canonicalize_path("/a b").is_err());
        let long = format!("/{}", "a".repeat(512));
        assert!(canonicalize_path(&long)
            .unwrap_err()
            .message
            .contains("513 bytes"));
        assert!(canonicalize_path(&format!("/{}", "a".repeat(511))).is_ok());
    }

    #[test]
    fn project_names() {
        assert!(validate_project("acme").is_ok());
        assert!(validate_project("0-a").is_ok());
        assert!(validate_project(&"a".repeat(63)).is_ok());
        assert!(validate_project(&"a".repeat(64)).is_err());
        assert!(validate_project("-a").is_err());
        assert!(validate_project("Acme").is_err());
        assert!(validate_project("").is_err());
    }
}
