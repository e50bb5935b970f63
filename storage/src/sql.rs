//! One way to run storage's SQL on either backend: SQLite (embedded, the
//! default) or PostgreSQL (`storage = "postgres://…"`).
//!
//! Storage's statements are written once, in the SQL both engines accept:
//! numbered parameters `?1`, `?2`… (turned into PostgreSQL's `$1`, `$2`…
//! once per statement), `ON CONFLICT` instead of `INSERT OR …`, `RETURNING`
//! instead of `last_insert_rowid()`, the `"offset"` column quoted, integers
//! as 64-bit (`BIGINT` on PostgreSQL) and casts where PostgreSQL cannot infer
//! a parameter's type. Where the engines differ (the schema, a few string
//! functions) the caller asks [`Db::dialect`].
//!
//! Statements are prepared once per connection and cached on both.

use std::cell::RefCell;
use std::collections::HashMap;

use anyhow::{Context, Result};

/// The engine behind a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    Sqlite,
    Postgres,
}

/// A statement parameter.
#[derive(Debug, Clone, Copy)]
pub enum Arg<'a> {
    Int(i64),
    Text(&'a str),
    Bytes(&'a [u8]),
    Null,
    /// An array of integers (PostgreSQL only: `BIGINT[]`).
    Ints(&'a [Option<i64>]),
    /// An array of texts (PostgreSQL only: `TEXT[]`).
    Texts(&'a [Option<&'a str>]),
}

impl From<i64> for Arg<'_> {
    fn from(v: i64) -> Self {
        Arg::Int(v)
    }
}

impl From<&i64> for Arg<'_> {
    fn from(v: &i64) -> Self {
        Arg::Int(*v)
    }
}

impl From<u32> for Arg<'_> {
    fn from(v: u32) -> Self {
        Arg::Int(v.into())
    }
}

impl From<&u32> for Arg<'_> {
    fn from(v: &u32) -> Self {
        Arg::Int((*v).into())
    }
}

impl<'a> From<&'a str> for Arg<'a> {
    fn from(v: &'a str) -> Self {
        Arg::Text(v)
    }
}

impl<'a> From<&'a &str> for Arg<'a> {
    fn from(v: &'a &str) -> Self {
        Arg::Text(v)
    }
}

impl<'a> From<&'a String> for Arg<'a> {
    fn from(v: &'a String) -> Self {
        Arg::Text(v)
    }
}

impl<'a> From<&'a Vec<u8>> for Arg<'a> {
    fn from(v: &'a Vec<u8>) -> Self {
        Arg::Bytes(v)
    }
}

impl From<Option<i64>> for Arg<'_> {
    fn from(v: Option<i64>) -> Self {
        v.map_or(Arg::Null, Arg::Int)
    }
}

impl<'a> From<&'a Option<String>> for Arg<'a> {
    fn from(v: &'a Option<String>) -> Self {
        v.as_deref().map_or(Arg::Null, Arg::Text)
    }
}

impl<'a> From<Option<&'a str>> for Arg<'a> {
    fn from(v: Option<&'a str>) -> Self {
        v.map_or(Arg::Null, Arg::Text)
    }
}

/// The parameters of one statement: `args![a, b, c]`.
macro_rules! args {
    ($($a:expr),* $(,)?) => {
        &[$($crate::sql::Arg::from($a)),*][..]
    };
}
pub(crate) use args;

impl rusqlite::ToSql for Arg<'_> {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        use rusqlite::types::{ToSqlOutput, ValueRef};
        Ok(ToSqlOutput::Borrowed(match *self {
            Arg::Int(v) => ValueRef::Integer(v),
            Arg::Text(v) => ValueRef::Text(v.as_bytes()),
            Arg::Bytes(v) => ValueRef::Blob(v),
            Arg::Null => ValueRef::Null,
            Arg::Ints(_) | Arg::Texts(_) => {
                return Err(rusqlite::Error::ToSqlConversionFailure(
                    "SQLite takes no array parameters".into(),
                ))
            }
        }))
    }
}

/// A PostgreSQL connection with its prepared statements. Each call blocks
/// on the connection's own small runtime; [`PgConn::pipeline`] sends several
/// statements before reading any answer (one round trip for all).
pub struct PgConn {
    /// Always `Some` until dropped (taken to shut it down without blocking:
    /// a connection may be dropped on an async worker).
    runtime: Option<tokio::runtime::Runtime>,
    client: tokio_postgres::Client,
    statements: RefCell<HashMap<String, tokio_postgres::Statement>>,
}

/// Runs a call of the blocking PostgreSQL client. Its client runs its own
/// small runtime, which cannot start on a thread that is running async
/// tasks: on a multi-thread runtime's worker the call moves out of the way
/// first (`block_in_place`); blocking threads (where storage is called
/// from) run it as is.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}

/// Where and how every PostgreSQL connection of a host is opened: the URL,
/// and the `[cluster] db-timeout-ms` that bounds each database call (no
/// hung connection holds a lease or a lock longer than that).
#[derive(Clone)]
pub struct PgTarget {
    /// The `postgres://` URL as configured.
    pub url: String,
    config: std::sync::Arc<tokio_postgres::Config>,
    /// `sslrootcert` of the URL: the CA that `sslmode=require` trusts.
    root_cert: Option<std::path::PathBuf>,
}

impl std::fmt::Debug for PgTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PgTarget({})", redact(&self.url))
    }
}

impl PgTarget {
    /// `url` with every call bounded by `timeout_ms`: connecting, each
    /// statement (`statement_timeout`), each lock wait (`lock_timeout`), a
    /// transaction left open (`idle_in_transaction_session_timeout`), and a
    /// peer that vanished (TCP keepalives and `TCP_USER_TIMEOUT`, so a
    /// half-open connection fails instead of waiting for hours).
    pub fn new(url: &str, timeout_ms: u64) -> Result<PgTarget> {
        let (parsed, root_cert) = super::tls::split_root_cert(url);
        let mut config: tokio_postgres::Config = parsed
            .parse()
            .with_context(|| format!("parsing the PostgreSQL URL {}", redact(url)))?;
        let timeout = std::time::Duration::from_millis(timeout_ms.max(1));
        let mut options = config.get_options().unwrap_or_default().to_string();
        for setting in [
            "statement_timeout",
            "lock_timeout",
            "idle_in_transaction_session_timeout",
        ] {
            options.push_str(&format!(" -c {setting}={}", timeout_ms.max(1)));
        }
        config
            .options(options.trim())
            .connect_timeout(timeout)
            .tcp_user_timeout(timeout)
            .keepalives(true)
            .keepalives_idle(timeout.div_f64(2.0).max(std::time::Duration::from_secs(1)))
            .keepalives_interval(std::time::Duration::from_secs(1))
            .keepalives_retries(3);
        Ok(PgTarget {
            url: url.to_string(),
            config: std::sync::Arc::new(config),
            root_cert,
        })
    }

    /// A new blocking client (TLS as the URL's `sslmode` says), for a
    /// connection that listens for notifications.
    pub fn client(&self) -> Result<postgres::Client> {
        let config = postgres::Config::from((*self.config).clone());
        blocking(|| super::tls::connect(&config, self.root_cert.as_deref()))
            .with_context(|| format!("connecting to PostgreSQL at {}", redact(&self.url)))
    }
}

impl PgConn {
    /// Connects to `target`.
    pub fn connect(target: &PgTarget) -> Result<PgConn> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("starting a PostgreSQL connection's runtime")?;
        let connected = blocking(|| {
            runtime.block_on(super::tls::connect_async(
                &target.config,
                target.root_cert.as_deref(),
            ))
        });
        let client = match connected {
            Ok(client) => client,
            Err(e) => {
                runtime.shutdown_background();
                return Err(e).with_context(|| {
                    format!("connecting to PostgreSQL at {}", redact(&target.url))
                });
            }
        };
        Ok(PgConn {
            runtime: Some(runtime),
            client,
            statements: RefCell::new(HashMap::new()),
        })
    }

    /// Runs `f` to its end on this connection's runtime (which also drives
    /// the connection itself).
    fn run<T>(&self, f: impl std::future::Future<Output = T>) -> T {
        let runtime = self
            .runtime
            .as_ref()
            .expect("a live connection has its runtime");
        blocking(|| runtime.block_on(f))
    }

    fn statement(&self, sql: &str) -> Result<tokio_postgres::Statement> {
        if let Some(s) = self.statements.borrow().get(sql) {
            return Ok(s.clone());
        }
        let translated = numbered_to_dollar(sql);
        let s = self
            .run(self.client.prepare(&translated))
            .with_context(|| format!("preparing {}", first_line(sql)))?;
        self.statements
            .borrow_mut()
            .insert(sql.to_string(), s.clone());
        Ok(s)
    }

    /// Whether the connection is gone (its next use would fail).
    pub fn is_closed(&self) -> bool {
        self.client.is_closed()
    }

    /// Runs `statements` in order, sending them all before reading any
    /// answer: one round trip instead of one each. Answers each one's rows
    /// or its error, in order. (Inside a transaction, a statement after a
    /// failed one fails too: the transaction is aborted.)
    pub fn pipeline(
        &self,
        statements: &[(&str, &[Arg<'_>])],
    ) -> Result<Vec<Result<Vec<tokio_postgres::Row>, tokio_postgres::Error>>> {
        use std::future::Future;
        use std::pin::Pin;
        use std::task::Poll;
        let prepared = statements
            .iter()
            .map(|(sql, _)| self.statement(sql))
            .collect::<Result<Vec<_>>>()?;
        let params: Vec<Vec<&(dyn postgres::types::ToSql + Sync)>> =
            statements.iter().map(|(_, args)| pg_params(args)).collect();
        type Query<'q> = Pin<
            Box<dyn Future<Output = Result<Vec<tokio_postgres::Row>, tokio_postgres::Error>> + 'q>,
        >;
        let mut queries: Vec<Query<'_>> = prepared
            .iter()
            .zip(&params)
            .map(|(s, p)| Box::pin(self.client.query(s, p)) as Query<'_>)
            .collect();
        let mut answers: Vec<Option<Result<Vec<tokio_postgres::Row>, tokio_postgres::Error>>> =
            statements.iter().map(|_| None).collect();
        // Each query is first polled in order, which sends it: the server
        // runs them in that order.
        self.run(std::future::poll_fn(|cx| {
            let mut pending = false;
            for (query, answer) in queries.iter_mut().zip(answers.iter_mut()) {
                if answer.is_none() {
                    match query.as_mut().poll(cx) {
                        Poll::Ready(r) => *answer = Some(r),
                        Poll::Pending => pending = true,
                    }
                }
            }
            if pending {
                Poll::Pending
            } else {
                Poll::Ready(())
            }
        }));
        Ok(answers
            .into_iter()
            .map(|a| a.expect("every query answered"))
            .collect())
    }
}

impl Drop for PgConn {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

pub use crate::redact;

fn first_line(sql: &str) -> &str {
    sql.trim().lines().next().unwrap_or("")
}

/// `?1` → `$1`, outside string literals and quoted names.
fn numbered_to_dollar(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut quote: Option<char> = None;
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        match quote {
            Some(q) => {
                if c == q {
                    quote = None;
                }
                out.push(c);
            }
            None if c == '\'' || c == '"' => {
                quote = Some(c);
                out.push(c);
            }
            None if c == '?' && chars.peek().is_some_and(char::is_ascii_digit) => out.push('$'),
            None => out.push(c),
        }
    }
    out
}

impl postgres::types::ToSql for Arg<'_> {
    fn to_sql(
        &self,
        ty: &postgres::types::Type,
        out: &mut postgres::types::private::BytesMut,
    ) -> std::result::Result<postgres::types::IsNull, Box<dyn std::error::Error + Sync + Send>>
    {
        use postgres::types::Type;
        match (*self, ty) {
            (Arg::Null, _) => Ok(postgres::types::IsNull::Yes),
            (Arg::Int(v), &Type::INT8) => v.to_sql(ty, out),
            (Arg::Int(v), &Type::INT4) => i32::try_from(v)?.to_sql(ty, out),
            (Arg::Int(v), &Type::INT2) => i16::try_from(v)?.to_sql(ty, out),
            (
                Arg::Text(v),
                &Type::TEXT | &Type::VARCHAR | &Type::BPCHAR | &Type::NAME | &Type::UNKNOWN,
            ) => v.to_sql(ty, out),
            (Arg::Bytes(v), &Type::BYTEA) => v.to_sql(ty, out),
            (Arg::Ints(v), &Type::INT8_ARRAY) => v.to_sql(ty, out),
            (Arg::Texts(v), &Type::TEXT_ARRAY) => v.to_sql(ty, out),
            (arg, ty) => Err(format!("a parameter of type {ty} cannot take {arg:?}").into()),
        }
    }

    fn accepts(_: &postgres::types::Type) -> bool {
        // Checked per value in `to_sql`.
        true
    }

    postgres::types::to_sql_checked!();
}

/// One row of an answer.
pub enum Row<'r> {
    Sqlite(&'r rusqlite::Row<'r>),
    Postgres(&'r tokio_postgres::Row),
}

impl Row<'_> {
    /// An integer column (PostgreSQL: any integer type).
    pub fn int(&self, i: usize) -> Result<i64> {
        self.opt_int(i)?
            .with_context(|| format!("column {i} is NULL"))
    }

    /// An integer column that may be NULL.
    pub fn opt_int(&self, i: usize) -> Result<Option<i64>> {
        Ok(match self {
            Row::Sqlite(r) => r.get(i)?,
            Row::Postgres(r) => {
                use postgres::types::Type;
                match *r.columns()[i].type_() {
                    Type::INT4 => r.try_get::<_, Option<i32>>(i)?.map(i64::from),
                    Type::INT2 => r.try_get::<_, Option<i16>>(i)?.map(i64::from),
                    _ => r.try_get(i)?,
                }
            }
        })
    }

    /// A text column.
    pub fn text(&self, i: usize) -> Result<String> {
        Ok(match self {
            Row::Sqlite(r) => r.get(i)?,
            Row::Postgres(r) => r.try_get(i)?,
        })
    }

    /// A text column that may be NULL.
    pub fn opt_text(&self, i: usize) -> Result<Option<String>> {
        Ok(match self {
            Row::Sqlite(r) => r.get(i)?,
            Row::Postgres(r) => r.try_get(i)?,
        })
    }

    /// A bytes column.
    pub fn bytes(&self, i: usize) -> Result<Vec<u8>> {
        Ok(match self {
            Row::Sqlite(r) => r.get(i)?,
            Row::Postgres(r) => r.try_get(i)?,
        })
    }
}

/// A connection of either engine, borrowed for a few statements.
#[derive(Clone, Copy)]
pub enum Db<'c> {
    Sqlite(&'c rusqlite::Connection),
    Postgres(&'c PgConn),
}

fn pg_params<'a>(args: &'a [Arg<'a>]) -> Vec<&'a (dyn postgres::types::ToSql + Sync)> {
    args.iter()
        .map(|a| a as &(dyn postgres::types::ToSql + Sync))
        .collect()
}

impl Db<'_> {
    pub fn dialect(&self) -> Dialect {
        match self {
            Db::Sqlite(_) => Dialect::Sqlite,
            Db::Postgres(_) => Dialect::Postgres,
        }
    }

    /// The statement for this engine, where the two differ.
    pub fn pick(&self, sqlite: &'static str, postgres: &'static str) -> &'static str {
        match self {
            Db::Sqlite(_) => sqlite,
            Db::Postgres(_) => postgres,
        }
    }

    /// Runs statements without parameters or answers (DDL, transaction
    /// control).
    pub fn batch(&self, sql: &str) -> Result<()> {
        match self {
            Db::Sqlite(c) => c.execute_batch(sql)?,
            Db::Postgres(c) => c.run(c.client.batch_execute(sql))?,
        }
        Ok(())
    }

    /// One fixed statement without parameters, prepared once (transaction
    /// control on the commit path).
    pub fn control(&self, sql: &str) -> Result<()> {
        match self {
            Db::Sqlite(c) => {
                c.prepare_cached(sql)?.execute([])?;
            }
            Db::Postgres(c) => {
                let s = c.statement(sql)?;
                c.run(c.client.execute(&s, &[]))?;
            }
        }
        Ok(())
    }

    /// Runs a statement; answers the rows it changed.
    pub fn execute(&self, sql: &str, args: &[Arg<'_>]) -> Result<u64> {
        match self {
            Db::Sqlite(c) => Ok(c
                .prepare_cached(sql)?
                .execute(rusqlite::params_from_iter(args))? as u64),
            Db::Postgres(c) => {
                let s = c.statement(sql)?;
                Ok(c.run(c.client.execute(&s, &pg_params(args)))?)
            }
        }
    }

    /// The first row of the answer, mapped, if there is one.
    pub fn query_opt<T>(
        &self,
        sql: &str,
        args: &[Arg<'_>],
        f: impl FnOnce(&Row<'_>) -> Result<T>,
    ) -> Result<Option<T>> {
        match self {
            Db::Sqlite(c) => {
                let mut stmt = c.prepare_cached(sql)?;
                let mut rows = stmt.query(rusqlite::params_from_iter(args))?;
                match rows.next()? {
                    Some(r) => Ok(Some(f(&Row::Sqlite(r))?)),
                    None => Ok(None),
                }
            }
            Db::Postgres(c) => {
                let s = c.statement(sql)?;
                let rows = c.run(c.client.query(&s, &pg_params(args)))?;
                match rows.first() {
                    Some(r) => Ok(Some(f(&Row::Postgres(r))?)),
                    None => Ok(None),
                }
            }
        }
    }

    /// The first row of the answer, mapped; an error when there is none.
    pub fn query_one<T>(
        &self,
        sql: &str,
        args: &[Arg<'_>],
        f: impl FnOnce(&Row<'_>) -> Result<T>,
    ) -> Result<T> {
        self.query_opt(sql, args, f)?
            .with_context(|| format!("no row for {}", first_line(sql)))
    }

    /// Every row of the answer, mapped, until `f` answers `None`.
    pub fn query_while<T>(
        &self,
        sql: &str,
        args: &[Arg<'_>],
        mut f: impl FnMut(&Row<'_>) -> Result<Option<T>>,
    ) -> Result<Vec<T>> {
        let mut out = Vec::new();
        match self {
            Db::Sqlite(c) => {
                let mut stmt = c.prepare_cached(sql)?;
                let mut rows = stmt.query(rusqlite::params_from_iter(args))?;
                while let Some(r) = rows.next()? {
                    match f(&Row::Sqlite(r))? {
                        Some(v) => out.push(v),
                        None => break,
                    }
                }
            }
            Db::Postgres(c) => {
                let s = c.statement(sql)?;
                for r in c.run(c.client.query(&s, &pg_params(args)))? {
                    match f(&Row::Postgres(&r))? {
                        Some(v) => out.push(v),
                        None => break,
                    }
                }
            }
        }
        Ok(out)
    }

    /// Every row of the answer, mapped.
    pub fn query_all<T>(
        &self,
        sql: &str,
        args: &[Arg<'_>],
        mut f: impl FnMut(&Row<'_>) -> Result<T>,
    ) -> Result<Vec<T>> {
        self.query_while(sql, args, |r| f(r).map(Some))
    }
}

/// `count` numbered placeholders from `?first` on, comma-separated
/// (`?2, ?3, ?4`), for an `IN (...)` list; both engines take them.
pub fn placeholders(first: usize, count: usize) -> String {
    (first..first + count)
        .map(|i| format!("?{i}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Whether `err` is the unique index `events_by_key` refusing an event
/// whose idempotency key its stream already holds (either engine).
pub fn is_duplicate_key(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        if let Some(rusqlite::Error::SqliteFailure(e, Some(message))) =
            cause.downcast_ref::<rusqlite::Error>()
        {
            return e.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE
                && message.contains("events.idempotency_key");
        }
        if let Some(db) = cause
            .downcast_ref::<postgres::Error>()
            .and_then(postgres::Error::as_db_error)
        {
            return *db.code() == postgres::error::SqlState::UNIQUE_VIOLATION
                && db.constraint() == Some("events_by_key");
        }
        false
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_are_numbered_from_the_first_given() {
        assert_eq!(placeholders(2, 3), "?2, ?3, ?4");
        assert_eq!(placeholders(1, 1), "?1");
        assert_eq!(numbered_to_dollar(&placeholders(2, 2)), "$2, $3");
    }

    #[test]
    fn a_duplicate_idempotency_key_is_told_from_other_failures() {
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        let db = Db::Sqlite(&conn);
        db.batch(
            "CREATE TABLE events (stream INTEGER, \"offset\" INTEGER, idempotency_key TEXT);
             CREATE UNIQUE INDEX events_by_offset ON events (stream, \"offset\");
             CREATE UNIQUE INDEX events_by_key ON events (stream, idempotency_key)
                 WHERE idempotency_key IS NOT NULL;",
        )
        .unwrap();
        let insert = |offset: i64, key: &str| {
            db.execute("INSERT INTO events VALUES (1, ?1, ?2)", args![offset, key])
        };
        insert(1, "a").unwrap();
        assert!(is_duplicate_key(&insert(2, "a").unwrap_err()));
        let same_offset = insert(1, "b").unwrap_err();
        assert!(!is_duplicate_key(&same_offset), "{same_offset:#}");
        assert!(!is_duplicate_key(&anyhow::anyhow!(
            "events.idempotency_key"
        )));
    }

    #[test]
    fn numbered_parameters_become_dollars_outside_quotes() {
        assert_eq!(
            numbered_to_dollar("SELECT '?1', \"a?2\" FROM t WHERE a = ?1 AND b = ?12 AND c = ?"),
            "SELECT '?1', \"a?2\" FROM t WHERE a = $1 AND b = $12 AND c = ?"
        );
    }

    #[test]
    fn a_url_loses_its_password_in_messages() {
        assert_eq!(
            redact("postgres://app:secret@db:5432/streams"),
            "postgres://app:***@db:5432/streams"
        );
        assert_eq!(redact("postgres://db/streams"), "postgres://db/streams");
    }

    #[test]
    fn sqlite_rows_map_through_the_common_api() {
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        let db = Db::Sqlite(&conn);
        db.batch("CREATE TABLE t (a INTEGER, b TEXT, c BLOB)")
            .unwrap();
        let name = String::from("x");
        let none: Option<String> = None;
        db.execute(
            "INSERT INTO t VALUES (?1, ?2, ?3)",
            args![7i64, &name, &vec![1u8, 2]],
        )
        .unwrap();
        db.execute("INSERT INTO t VALUES (?1, ?2, NULL)", args![8i64, &none])
            .unwrap();
        let rows = db
            .query_all("SELECT a, b FROM t ORDER BY a", args![], |r| {
                Ok((r.int(0)?, r.opt_text(1)?))
            })
            .unwrap();
        assert_eq!(rows, vec![(7, Some("x".into())), (8, None)]);
        let first = db
            .query_while("SELECT a FROM t ORDER BY a", args![], |r| {
                Ok((r.int(0)? < 8).then_some(r.int(0)?))
            })
            .unwrap();
        assert_eq!(first, vec![7]);
        assert!(db
            .query_opt("SELECT a FROM t WHERE a = ?1", args![9i64], |r| r.int(0))
            .unwrap()
            .is_none());
        assert_eq!(
            db.query_one("SELECT c FROM t WHERE a = ?1", args![7i64], |r| r.bytes(0))
                .unwrap(),
            vec![1, 2]
        );
    }
}
