//! JSONata filters and transforms, over the `jsonata-core` engine (our
//! patched copy, crate `streamhost-jsonata` in `jsonata/`, that bounds the
//! time and the values built inside built-in functions).
//!
//! Expressions are compiled once and cached by their text; evaluation runs on
//! an already-parsed event under the [`Limits`] (time, the size of every value
//! it builds, an allocation budget, stack depth), and a panic inside the
//! engine becomes an error, never a crash. A bound exceeded is an error whose
//! text starts with [`LIMIT_EXCEEDED_PREFIX`] and names the bound
//! ([`is_limit_exceeded`]). Async callers run evaluations on the host's
//! pool of threads.

pub mod memory;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use jsonata_core::ast::AstNode;
use jsonata_core::evaluator::{Context, Evaluator, EvaluatorOptions};
use jsonata_core::value::JValue;
use serde_json::Value;

/// Longest expression accepted, in bytes.
pub const EXPRESSION_BYTES_MAX: usize = 4096;
/// Default wall-clock limit of one evaluation (`[limits] jsonata-timeout-ms`).
pub const EVALUATION_TIMEOUT_MS: u64 = 100;
/// Default bound on any value an evaluation builds (`[limits] jsonata-max-bytes`).
pub const VALUE_BYTES_MAX: usize = 1024 * 1024;
/// Evaluation stack-depth limit.
pub const EVALUATION_DEPTH_MAX: usize = 500;
/// Allocation budget of one evaluation, in multiples of the value bound: the
/// engine's values take several times their JSON size in memory.
const BUDGET_PER_VALUE_BYTE: usize = 8;
/// How the text of an error for an exceeded bound starts.
pub const LIMIT_EXCEEDED_PREFIX: &str = "JSONata limit exceeded";

/// The bounds an evaluation runs under: its host's `[limits]`, carried by
/// every expression compiled for that host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// `[limits] jsonata-timeout-ms`.
    pub timeout_ms: u64,
    /// `[limits] jsonata-max-bytes`.
    pub max_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            timeout_ms: EVALUATION_TIMEOUT_MS,
            max_bytes: VALUE_BYTES_MAX,
        }
    }
}

/// Whether an evaluation error is a bound exceeded (not retryable: the same
/// expression on the same event exceeds it again).
pub fn is_limit_exceeded(message: &str) -> bool {
    message.contains(LIMIT_EXCEEDED_PREFIX)
}

/// Where in `source` an evaluation error arose, as far as its message
/// tells: the function it names (`$error`, `$assert`, `$number`, a
/// `$name` it quotes) or the operator (`the + operator`). Answers the
/// 1-based character position of that token's first occurrence.
pub fn evaluation_error_position(source: &str, message: &str) -> Option<usize> {
    let (code, text) = split_code(message);
    let mut tokens: Vec<String> = Vec::new();
    match code.as_str() {
        "D3137" => tokens.push("$error".into()),
        "D3141" => tokens.push("$assert".into()),
        "D3030" => tokens.push("$number".into()),
        _ => {}
    }
    // A `$name` the message quotes.
    if let Some(i) = text.find('$') {
        let name: String = text[i..]
            .chars()
            .enumerate()
            .take_while(|(n, c)| *n == 0 || c.is_alphanumeric() || *c == '_')
            .map(|(_, c)| c)
            .collect();
        if name.len() > 1 {
            tokens.push(name);
        }
    }
    // "... of the + operator ...".
    if let Some(rest) = text.split("the ").find_map(|part| {
        part.strip_suffix(" operator")
            .or_else(|| part.split_once(" operator").map(|(op, _)| op))
    }) {
        if !rest.is_empty() && rest.len() <= 3 {
            tokens.push(rest.to_string());
        }
    }
    tokens
        .iter()
        .find_map(|t| source.find(t.as_str()))
        .map(|byte| source[..byte].chars().count() + 1)
}

/// An evaluation error of `source` as a failure names it: the engine's
/// code and text, and where in the expression it arose when the message
/// tells.
pub fn describe_error(source: &str, message: &str) -> String {
    match evaluation_error_position(source, message) {
        Some(at) => format!("{message} (at character {at} of {source:?})"),
        None => format!("{message} (in {source:?})"),
    }
}

/// The text of an engine error, with an exceeded bound named.
fn describe(message: &str, limits: Limits) -> String {
    let code = message.get(..5).unwrap_or("");
    match code {
        "D1012" => format!(
            "{LIMIT_EXCEEDED_PREFIX}: the evaluation ran over {} ms ([limits] jsonata-timeout-ms)",
            limits.timeout_ms
        ),
        "U1004" | "D2014" | "D2015" => format!(
            "{LIMIT_EXCEEDED_PREFIX}: {} ([limits] jsonata-max-bytes = {})",
            message.get(6..).unwrap_or(message).trim(),
            limits.max_bytes
        ),
        "D1011" | "U1001" => format!(
            "{LIMIT_EXCEEDED_PREFIX}: the evaluation nested deeper than {EVALUATION_DEPTH_MAX} levels (recursion)"
        ),
        _ => message.to_string(),
    }
}
/// Compiled expressions kept in the cache; the cache is cleared when full.
const CACHE_ENTRIES_MAX: usize = 4096;

/// A compiled expression and the bounds it evaluates under. Cheap to clone.
#[derive(Clone)]
pub struct Expression {
    source: Arc<str>,
    ast: Arc<AstNode>,
    limits: Limits,
}

impl std::fmt::Debug for Expression {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Expression({:?})", self.source)
    }
}

/// A parsed expression: its text and syntax tree.
type Parsed = (Arc<str>, Arc<AstNode>);

/// Parsed expressions by their text (bounds apart: they are the caller's).
fn cache() -> &'static Mutex<HashMap<String, Parsed>> {
    static CACHE: std::sync::OnceLock<Mutex<HashMap<String, Parsed>>> = std::sync::OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Splits an engine message `"S0211: text"` into its code and text.
fn split_code(message: &str) -> (String, String) {
    let bytes = message.as_bytes();
    let coded = bytes.len() > 6
        && bytes[0].is_ascii_uppercase()
        && bytes[1..5].iter().all(u8::is_ascii_digit)
        && bytes[5] == b':';
    if coded {
        (message[..5].to_string(), message[6..].trim().to_string())
    } else {
        ("S0201".to_string(), message.to_string())
    }
}

fn parse(text: &str) -> Result<AstNode, String> {
    match crate::invariant::contained(|| jsonata_core::parser::parse(text)) {
        Ok(Ok(ast)) => Ok(ast),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("S0201: the JSONata parser failed on this expression".to_string()),
    }
}

fn is_end_of_input(message: &str) -> bool {
    message.starts_with("S0207")
        || message.starts_with("S0203")
        || message.starts_with("S0101")
        || message.starts_with("S0105")
        || message.contains("Unclosed comment")
}

/// Character counts at which `text` may be cut without splitting a name,
/// keyword or number (cutting `and` to `a` would read as a name, and `1.5`
/// to `1.` as a bad number: errors the whole text does not have).
fn token_ends(text: &str) -> Vec<usize> {
    let word = |c: char| c.is_alphanumeric() || c == '_' || c == '$';
    let chars: Vec<char> = text.chars().collect();
    (0..chars.len())
        .filter(|&i| {
            let (c, next) = (chars[i], chars.get(i + 1).copied());
            let splits_word = word(c) && next.is_some_and(word);
            let splits_number = (c.is_ascii_digit() && next == Some('.'))
                || (c == '.' && i > 0 && chars[i - 1].is_ascii_digit());
            !splits_word && !splits_number
        })
        .map(|i| i + 1)
        .collect()
}

/// Whether the first `n` characters of `text` have an error other than
/// "unexpected end of input".
fn prefix_fails(text: &str, n: usize) -> bool {
    let end = text.char_indices().nth(n).map_or(text.len(), |(i, _)| i);
    matches!(parse(&text[..end]), Err(m) if !is_end_of_input(&m))
}

/// The position (characters from the start) where a parse error occurs: the
/// shortest prefix, cut at a token end, whose error is not "unexpected end
/// of input". The engine reports no position itself. Once such a prefix
/// fails, longer ones fail too (more text cannot repair it), so it is found
/// by bisection: O(log n) parses, not one per character.
fn error_position(text: &str) -> usize {
    let ends = token_ends(text);
    let total = text.chars().count();
    let Some(&last) = ends.last() else {
        return total;
    };
    if !prefix_fails(text, last) {
        return total;
    }
    // Invariant: `ends[hi]` fails; every end before `ends[lo]` does not.
    let (mut lo, mut hi) = (0, ends.len() - 1);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if prefix_fails(text, ends[mid]) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    ends[hi]
}

/// Compiles `text` to evaluate under `limits`, using the cache. Errors read
/// `invalid JSONata expression (<code>, position <n>): <message>`.
pub fn compile(text: &str, limits: Limits) -> Result<Expression, String> {
    if let Some((source, ast)) = cache().lock().expect("jsonata cache").get(text) {
        return Ok(Expression {
            source: source.clone(),
            ast: ast.clone(),
            limits,
        });
    }
    if text.len() > EXPRESSION_BYTES_MAX {
        return Err(format!(
            "invalid JSONata expression: {} bytes, over the {EXPRESSION_BYTES_MAX}-byte limit",
            text.len()
        ));
    }
    if text.trim().is_empty() {
        return Err(
            "invalid JSONata expression (S0207, position 0): the expression is empty".into(),
        );
    }
    let ast = parse(text).map_err(|m| {
        let (code, message) = split_code(&m);
        format!(
            "invalid JSONata expression ({code}, position {}): {message}",
            error_position(text)
        )
    })?;
    let e = Expression {
        source: text.into(),
        ast: Arc::new(ast),
        limits,
    };
    let mut cache = cache().lock().expect("jsonata cache");
    if cache.len() >= CACHE_ENTRIES_MAX {
        cache.clear();
    }
    cache.insert(text.to_string(), (e.source.clone(), e.ast.clone()));
    Ok(e)
}

/// An input converted once for the engine; evaluate several expressions on it.
pub struct Input(JValue);

impl Input {
    pub fn new(value: &Value) -> Input {
        Input(JValue::from(value.clone()))
    }
}

impl Expression {
    /// The expression's text.
    pub fn source(&self) -> &str {
        &self.source
    }

    fn evaluate_raw(&self, input: &Input) -> Result<JValue, String> {
        let limits = self.limits;
        let options = EvaluatorOptions {
            timeout_ms: Some(limits.timeout_ms),
            max_stack_depth: Some(EVALUATION_DEPTH_MAX),
            max_value_bytes: Some(limits.max_bytes),
            ..EvaluatorOptions::default()
        };
        let ast = &self.ast;
        let budget = jsonata_core::bounds::Budget::start(
            limits.max_bytes.saturating_mul(BUDGET_PER_VALUE_BYTE),
        );
        // Inside built-ins too (the evaluator's own loops check `timeout_ms`).
        let deadline = jsonata_core::bounds::Deadline::start(limits.timeout_ms);
        let result = crate::invariant::contained(|| {
            Evaluator::with_options(Context::new(), options).evaluate(ast, &input.0)
        });
        drop(deadline);
        drop(budget);
        match result {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(describe(e.message(), limits)),
            Err(_) => Err("the JSONata evaluator panicked".to_string()),
        }
    }

    /// Evaluates to JSON; `None` when the result is undefined.
    pub fn evaluate(&self, input: &Input) -> Result<Option<Value>, String> {
        let v = self.evaluate_raw(input)?;
        if matches!(v, JValue::Undefined) {
            return Ok(None);
        }
        // A result may share parts (`{"a": $x, "b": $x}`); written out, it
        // is held to the bound too.
        let max = self.limits.max_bytes;
        let bytes = jsonata_core::bounds::value_bytes(&v, max);
        if bytes > max {
            return Err(format!(
                "{LIMIT_EXCEEDED_PREFIX}: the result is {bytes} bytes or more, over the {max}-byte limit ([limits] jsonata-max-bytes = {max})"
            ));
        }
        Ok(Some(integral_numbers(Value::from(&v))))
    }

    /// A condition matches only when it evaluates to exactly `true`.
    pub fn matches(&self, input: &Input) -> Result<bool, String> {
        Ok(matches!(self.evaluate_raw(input)?, JValue::Bool(true)))
    }
}

/// JSONata numbers are doubles; like JavaScript's `JSON.stringify`, write
/// integral ones as integers (`6`, not `6.0`).
fn integral_numbers(v: Value) -> Value {
    match v {
        Value::Number(n) => match n.as_f64() {
            Some(f) if n.is_f64() && f.fract() == 0.0 && f.abs() < 9_007_199_254_740_992.0 => {
                Value::from(f as i64)
            }
            _ => Value::Number(n),
        },
        Value::Array(items) => Value::Array(items.into_iter().map(integral_numbers).collect()),
        Value::Object(map) => Value::Object(
            map.into_iter()
                .map(|(k, v)| (k, integral_numbers(v)))
                .collect(),
        ),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Compiles under the default bounds.
    fn compile(text: &str) -> Result<Expression, String> {
        super::compile(text, Limits::default())
    }

    fn event() -> Input {
        Input::new(&json!({"type": "x.y/order", "payload": {"region": "eu", "total": 120}}))
    }

    #[test]
    fn conditions_match_only_exactly_true() {
        assert!(compile("payload.region = 'eu'")
            .unwrap()
            .matches(&event())
            .unwrap());
        assert!(!compile("payload.total > 200")
            .unwrap()
            .matches(&event())
            .unwrap());
        // Truthy but not `true`.
        assert!(!compile("payload.region")
            .unwrap()
            .matches(&event())
            .unwrap());
        assert!(!compile("1").unwrap().matches(&event()).unwrap());
        assert!(!compile("payload.missing")
            .unwrap()
            .matches(&event())
            .unwrap());
    }

    #[test]
    fn transforms_build_json() {
        let t = compile(r#"{"type": "x.y/summary", "payload": {"r": payload.region}}"#).unwrap();
        assert_eq!(
            t.evaluate(&event()).unwrap(),
            Some(json!({"type": "x.y/summary", "payload": {"r": "eu"}}))
        );
        assert_eq!(
            compile("payload.nothing")
                .unwrap()
                .evaluate(&event())
                .unwrap(),
            None
        );
    }

    #[test]
    fn parse_errors_carry_code_and_position() {
        let e = compile("payload.total > ").unwrap_err();
        assert!(
            e.starts_with("invalid JSONata expression (S0207, position 16)"),
            "{e}"
        );
        let e = compile("payload.x = = 3").unwrap_err();
        assert!(
            e.starts_with("invalid JSONata expression (S0211, position 13)")
                || e.contains("position 13"),
            "{e}"
        );
        assert!(compile("").is_err());
    }

    /// A scan of every token end, the oracle of the bisection.
    fn error_position_linear(text: &str) -> usize {
        token_ends(text)
            .into_iter()
            .find(|&n| prefix_fails(text, n))
            .unwrap_or(text.chars().count())
    }

    #[test]
    fn bisection_finds_the_position_the_linear_scan_finds() {
        for text in [
            "payload.total > ",
            "payload.x = = 3",
            "a.b.c ) + 1",
            "payload.é = = \"ü\"",
            "$sum(payload.items.(price * qty)",
            "type = 'x' and and payload.n > 1",
            "((1 + 2) * 3))",
            "[1, 2,, 3]",
            "{\"a\": 1 \"b\": 2}",
            "payload.n >= 1e3 ]",
        ] {
            assert_eq!(error_position(text), error_position_linear(text), "{text}");
        }
        // `and` is also a field name: the error is at `payload`.
        assert_eq!(error_position("type = 'x' and and payload.n > 1"), 26);
        assert_eq!(error_position("payload.n > 1.5 )"), 17);
        // A long expression costs O(log n) parses.
        let long = format!("{} ) ", "payload.a + ".repeat(100));
        assert_eq!(error_position(&long), error_position_linear(&long));
    }

    #[test]
    fn evaluation_errors_and_runaway_expressions_are_errors() {
        assert!(compile("$number('x')").unwrap().evaluate(&event()).is_err());
        let runaway = compile("($f := function($n) { $f($n + 1) }; $f(0))").unwrap();
        assert!(runaway.evaluate(&event()).is_err());
        let slow = compile("$count([1..10000000].($ * 2))").unwrap();
        assert!(slow.evaluate(&event()).is_err(), "bounded by the timeout");
    }

    fn limit_error(expression: &str) -> String {
        let e = compile(expression)
            .unwrap()
            .evaluate(&event())
            .expect_err(expression);
        assert!(is_limit_exceeded(&e), "{expression}: {e}");
        e
    }

    #[test]
    fn ranges_are_bounded_by_the_values_they_build() {
        let e = limit_error("$count([1..9999999]) > 0");
        assert!(e.contains("jsonata-max-bytes = 1048576"), "{e}");
        limit_error("$count([1..200000])");
        assert_eq!(
            compile("$count([1..1000])")
                .unwrap()
                .evaluate(&event())
                .unwrap(),
            Some(json!(1000))
        );
    }

    #[test]
    fn string_builtins_are_refused_before_they_allocate() {
        limit_error("$length($pad('', 300000000)) > 0");
        limit_error("$length($pad('', -300000000)) > 0");
        limit_error("$join([1..1000].$string(), $pad('', 100000))");
        limit_error("$replace($pad('', 100000, 'a'), 'a', $pad('', 1000, 'b'))");
        limit_error("$replace($pad('', 100000, 'a'), /a/, $pad('', 1000, 'b'))");
        // `&` doubling: every step is checked before the string is built.
        limit_error("($f := function($s, $n) { $n = 0 ? $s : $f($s & $s, $n - 1) }; $f('x', 40))");
        assert_eq!(
            compile("$pad('x', 3, '-') & $join(['a', 'b'], ',')")
                .unwrap()
                .evaluate(&event())
                .unwrap(),
            Some(json!("x--a,b"))
        );
        // The whole bound is usable.
        assert_eq!(
            compile("$length($pad('', 1000000))")
                .unwrap()
                .evaluate(&event())
                .unwrap(),
            Some(json!(1000000))
        );
    }

    #[test]
    fn arrays_built_step_by_step_stop_at_the_budget() {
        // Each item is small; the sequence is not.
        limit_error("$count([1..100000].($pad('', 1000)))");
        limit_error("$count($map([1..100000], function($v) { $pad('', 1000) }))");
        limit_error("$string([1..100000].[$, $, $, $, $, $, $, $])");
        limit_error(
            "$count($reduce([1..100000], function($acc, $v) { $append($acc, $pad('', 100)) }, []))",
        );
    }

    #[test]
    fn objects_built_step_by_step_stop_at_the_budget() {
        limit_error("$count($keys($merge([1..100000].{$string($): $pad('', 100)})))");
        limit_error("$count($spread([1..60000]{$string($): $pad('', 100)}))");
        assert_eq!(
            compile("$merge([{'a': 1}, {'b': 2}])")
                .unwrap()
                .evaluate(&event())
                .unwrap(),
            Some(json!({"a": 1, "b": 2}))
        );
    }

    #[test]
    fn a_short_evaluation_does_not_read_the_cpu_clock() {
        // Each read is a system call, once as costly as a filter's whole
        // evaluation: the deadline's clock starts at its first check that
        // reads it, which a filter or a transform never reaches.
        let filter = compile("payload.region = 'eu' and payload.total > 100").unwrap();
        let transform = compile("{'region': payload.region, 'total': payload.total * 2}").unwrap();
        let before = jsonata_core::bounds::clock_reads();
        for _ in 0..1000 {
            assert!(filter.matches(&event()).unwrap());
            transform.evaluate(&event()).unwrap();
        }
        assert_eq!(jsonata_core::bounds::clock_reads(), before);
        // A longer one reads it, and ends at the bound (below).
        limit_error("$count($distinct([1..30000])) = 0");
        assert!(jsonata_core::bounds::clock_reads() > before);
    }

    #[test]
    fn a_quadratic_built_in_ends_at_the_time_bound() {
        // $distinct over 30,000 numbers is 450 million comparisons (seconds
        // of CPU); the deadline inside it ends the call at the bound.
        let started = std::time::Instant::now();
        let e = limit_error("$count($distinct([1..30000])) = 0");
        assert!(e.contains("jsonata-timeout-ms"), "{e}");
        assert!(
            started.elapsed() < std::time::Duration::from_secs(2),
            "ended after {:?}",
            started.elapsed()
        );
        // Below the bound it still answers.
        assert_eq!(
            compile("$count($distinct([1, 2, 2, 3]))")
                .unwrap()
                .evaluate(&event())
                .unwrap(),
            Some(json!(3))
        );
    }

    #[test]
    fn built_ins_whose_work_grows_faster_than_their_input_end_at_the_time_bound() {
        // Each builds at most a few hundred kilobytes, well within the size
        // bound, and takes seconds unbounded (a debug build): sorting,
        // grouping, merging, membership and deduplication over 20,000
        // items, by key or by value, with and without a function. Each
        // answers or is refused at the time bound, within it and a margin.
        for src in [
            "$count($keys([1..20000].{$string($): 1}))",
            "$count([1..20000]{$string($): $})",
            "$count([1..20000][$ in [1..20000]])",
            "$count($sort([1..20000].$string()))",
            "$count($merge([1..20000].{$string($): 1}))",
            "$count($spread([1..20000].{$string($): 1}))",
            "$count($split($join([1..20000].$string(), ','), ','))",
            "$count($each($merge([1..20000].{$string($): 1}), function($v, $k) {$k}))",
            "$count($distinct([1..20000].{'a': $}))",
            "$count($filter([1..20000], function($v) {$v in [1..20000]}))",
            "$boolean([1..20000].$string() = '19999')",
        ] {
            let started = std::time::Instant::now();
            let answer = compile(src).unwrap().evaluate(&event());
            let took = started.elapsed();
            if let Err(e) = answer {
                assert!(
                    is_limit_exceeded(&e) && e.contains("jsonata-timeout-ms"),
                    "{src}: {e}"
                );
            }
            // 100 ms, and a margin for a debug build on a busy machine.
            assert!(
                took < std::time::Duration::from_millis(600),
                "{src} ended after {took:?}"
            );
        }
    }

    #[test]
    fn recursion_is_bounded_by_depth_and_time() {
        let e = limit_error("($f := function($n) { $f($n + 1) + 1 }; $f(0))");
        assert!(e.contains("levels"), "{e}");
        let e = limit_error("($f := function($n) { $f($n + 1) }; $f(0))");
        assert!(
            e.contains("jsonata-timeout-ms") || e.contains("levels"),
            "{e}"
        );
    }

    #[test]
    fn evaluation_errors_name_where_they_arose() {
        let at = |src: &str| {
            let e = compile(src).unwrap().evaluate(&event()).unwrap_err();
            (evaluation_error_position(src, &e), describe_error(src, &e))
        };
        let (pos, text) = at("payload.total > 1 ? $error(\"too big: \" & payload.total) : 1");
        assert_eq!(pos, Some(21), "{text}");
        assert!(
            text.starts_with("D3137: too big: 120 (at character 21 of"),
            "{text}"
        );
        assert_eq!(at("payload.total + \"a\"").0, Some(15));
        assert_eq!(at("$assert(false, \"no\")").0, Some(1));
        assert_eq!(at("1 + $foo()").0, Some(5));
        let (pos, text) = at("$lookup(payload, 1, 2, 3)");
        assert_eq!(pos, None, "{text}");
        assert!(
            text.contains("(in \"$lookup(payload, 1, 2, 3)\")"),
            "{text}"
        );
    }

    #[test]
    fn an_error_that_is_not_a_bound_is_not_called_one() {
        let e = compile("$number('x')")
            .unwrap()
            .evaluate(&event())
            .unwrap_err();
        assert!(!is_limit_exceeded(&e), "{e}");
    }
}
