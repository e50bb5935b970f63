// jsonatapy - High-performance Python implementation of JSONata
// Copyright (c) 2025 jsonatapy contributors
// Licensed under the MIT License

//! # jsonata-core
//!
//! A high-performance Rust implementation of [JSONata](https://jsonata.org) — the
//! JSON query and transformation language — with optional Python bindings via PyO3.
//!
//! ## Quick start
//!
//! Parsing produces an [`AstNode`](ast::AstNode); evaluating it against a
//! [`value::JValue`] produces another `JValue`.
//!
//! ```
//! use jsonata_core::{evaluator::Evaluator, parser, value::JValue};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let ast = parser::parse("Account.Order.Product.(Price * Quantity)")?;
//! let data = JValue::from_json_str(
//!     r#"{"Account": {"Order": [{"Product": [
//!            {"Price": 34.45, "Quantity": 2},
//!            {"Price": 21.67, "Quantity": 1}
//!        ]}]}}"#,
//! )?;
//!
//! let line_totals = Evaluator::new().evaluate(&ast, &data)?;
//! assert_eq!(line_totals.to_json_string()?, "[68.9,21.67]");
//! # Ok(())
//! # }
//! ```
//!
//! ## Compile once, evaluate many times
//!
//! Parsing is the expensive step. [`Expression`] parses once and reuses the
//! result across payloads — and runs compilable expressions on the bytecode
//! VM (the same dispatch the Python and C bindings use), falling back to the
//! tree-walking [`Evaluator`](evaluator::Evaluator) otherwise.
//!
//! ```
//! use jsonata_core::{Expression, value::JValue};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let expr = Expression::compile("orders[price > 100].product")?;
//!
//! let payloads = [
//!     r#"{"orders": [{"product": "widget", "price": 150}]}"#,
//!     r#"{"orders": [{"product": "gizmo", "price": 50}]}"#,
//! ];
//!
//! let mut matched = Vec::new();
//! for payload in payloads {
//!     let data = JValue::from_json_str(payload)?;
//!     if let Some(product) = expr.evaluate(&data)?.as_str() {
//!         matched.push(product.to_string());
//!     }
//! }
//!
//! assert_eq!(matched, ["widget"]);
//! # Ok(())
//! # }
//! ```
//!
//! Bindings and host functions need the tree-walker: keep using
//! [`Evaluator`](evaluator::Evaluator) (with `expr.ast()` if you compiled an
//! [`Expression`]) for those.
//!
//! ## Handling errors
//!
//! The two phases fail with two distinct error types, so you can tell a bad
//! expression apart from a bad evaluation. Both implement [`std::error::Error`],
//! so `?` into a boxed error works when you do not need to distinguish them.
//!
//! ```
//! use jsonata_core::{evaluator::Evaluator, parser, value::JValue};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // A malformed expression fails at parse time.
//! let err = parser::parse("orders[price > ").unwrap_err();
//! println!("could not parse: {err}");
//!
//! // A well-formed expression can still fail against the data it is given.
//! let ast = parser::parse("orders.price * 2")?;
//! let data = JValue::from_json_str(r#"{"orders": [{"price": "free"}]}"#)?;
//!
//! let outcome = Evaluator::new().evaluate(&ast, &data);
//! match &outcome {
//!     Ok(total) => println!("total: {}", total.to_json_string()?),
//!     Err(e) => println!("could not evaluate: {e}"),
//! }
//! // The left side of `*` is a string in this payload, so evaluation fails.
//! assert!(outcome.is_err());
//! # Ok(())
//! # }
//! ```
//!
//! ## Extending expressions with host functions
//!
//! [`Evaluator::register_fn`](evaluator::Evaluator::register_fn) exposes your own
//! Rust closures to an expression as `$name(...)`. See its documentation for
//! resolution order and for overriding built-ins.
//!
//! ```
//! use jsonata_core::{evaluator::Evaluator, parser, value::JValue};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let mut ev = Evaluator::new();
//! ev.register_fn("initials", |args: &[JValue]| {
//!     let name = args.first().and_then(|v| v.as_str()).unwrap_or("");
//!     let initials: String = name.split_whitespace().filter_map(|w| w.chars().next()).collect();
//!     Ok(JValue::from(initials))
//! })?;
//!
//! let ast = parser::parse("$initials(user.name)")?;
//! let data = JValue::from_json_str(r#"{"user": {"name": "Ada Lovelace"}}"#)?;
//! assert_eq!(ev.evaluate(&ast, &data)?, JValue::from("AL"));
//! # Ok(())
//! # }
//! ```
//!
//! ## Architecture
//!
//! - [`parser`] — expression parser (JSONata source to AST)
//! - [`expression`] — compile-once [`Expression`] API (bytecode VM dispatch)
//! - [`evaluator`] — tree-walking evaluator (executes an AST against data)
//! - [`value`] — the runtime value representation, [`value::JValue`]
//! - [`functions`] — built-in function implementations
//! - [`ast`] — Abstract Syntax Tree definitions
//! - [`ast_transform`] — AST rewriting used by the compilation layer
//!
//! Two further modules are feature-gated: `lazy` (zero-copy views over Python
//! objects, with `python`) and `capi` (the C ABI surface, with `capi`).

pub mod ast;
pub mod ast_transform;
pub mod bounds;
mod builtins;
mod compiler;
mod datetime;
pub mod evaluator;
pub mod expression;
pub mod functions;
pub mod parser;
mod signature;
pub mod value;
mod vm;

pub use expression::Expression;
