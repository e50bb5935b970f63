//! No code: this crate only unifies the features of the workspace's
//! dependencies (see its `Cargo.toml`).
