//! `streamhost serve`: the server, until a signal stops it.

use super::*;

#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    /// TOML config file (see the README, "Using it"); flags override it.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Directory for the database [default: ./streamhost-data].
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Address to listen on [default: 127.0.0.1:7410]; port 0 picks a free one.
    #[arg(long)]
    pub listen: Option<std::net::SocketAddr>,
    /// "full" (fsync before every acknowledgement) or "normal".
    #[arg(long, value_parser = parse_durability)]
    pub durability: Option<Durability>,
    /// Store streams in this PostgreSQL database instead of SQLite
    /// (`postgres://user@host:port/db`; `storage` in the config).
    #[arg(long, value_name = "URL")]
    pub postgres: Option<String>,
    /// Also consume the JetStream stream STREAMHOST_INGEST of this NATS
    /// server (`nats://host:port`; `[ingest] nats-url`).
    #[arg(long)]
    pub nats: Option<String>,
    /// Keep compiled components here instead of DATA_DIR/compiled (several
    /// data dirs on one machine, or servers started often, share the work
    /// of compiling; `[processors] compile-cache-dir`).
    #[arg(long, value_name = "DIR", env = "STREAMHOST_COMPILE_CACHE_DIR")]
    pub compile_cache_dir: Option<PathBuf>,
}

pub(super) fn parse_durability(s: &str) -> Result<Durability, String> {
    match s {
        "full" => Ok(Durability::Full),
        "normal" => Ok(Durability::Normal),
        other => Err(format!(
            "durability {other:?} is not \"full\" or \"normal\""
        )),
    }
}

pub(super) async fn serve(args: ServeArgs) -> Result<()> {
    let mut config = match &args.config {
        Some(path) => Config::load(path)?,
        None => Config::default(),
    };
    if let Some(d) = args.data_dir {
        config.data_dir = d;
    }
    if let Some(l) = args.listen {
        config.listen = l;
    }
    if let Some(d) = args.durability {
        config.durability = d;
    }
    if let Some(url) = args.nats {
        config.ingest.nats_url = Some(url);
    }
    if let Some(url) = args.postgres {
        config.storage = Some(url);
    }
    if let Some(dir) = args.compile_cache_dir {
        config.processors.compile_cache_dir = Some(dir);
    }
    config.validate()?;
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("listening on {}", config.listen))?;
    let addr = listener.local_addr()?;
    if config.cluster.advertise_url.is_none() {
        config.cluster.advertise_url = Some(format!("http://{addr}"));
    }
    let storage = match config.postgres_url()? {
        Some(url) => crate::storage::sql::redact(url),
        None => "sqlite".to_string(),
    };
    tracing::info!(data_dir = %config.data_dir.display(), durability = ?config.durability, %storage, "starting");
    let host = Host::open(config)?;
    // Tests and scripts read this line to find the port.
    println!("streamhost listening on http://{addr}");
    host.serve(listener, shutdown_signal()).await
}

pub(super) async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
    tracing::info!("shutting down");
}
