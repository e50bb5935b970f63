//! `Host::router` and `Host::serve`: the HTTP API of a host, mounted in an
//! application's router or served on a listener of its own.

use std::future::Future;

use anyhow::Result;
use tokio::net::TcpListener;

use crate::host::Host;

impl Host {
    /// The HTTP API as an axum [`Router`](axum::Router), to serve from an
    /// application's own server, alone or under a prefix with
    /// [`Router::nest`](axum::Router::nest) (the console finds the API
    /// under the prefix it is served from). [`Host::serve`] adds what a
    /// public listener needs around it (header and idle timeouts, a bound
    /// on connections, handing streams over on shutdown); a mounted router
    /// has the application's server's. With several hosts, each host's
    /// `advertise-url` includes the prefix.
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> anyhow::Result<()> {
    /// # let dir = tempfile::tempdir()?;
    /// # let host = streamhost::Host::open(streamhost::Config { data_dir: dir.path().into(), ..Default::default() })?;
    /// let app = axum::Router::new()
    ///     .route("/", axum::routing::get(|| async { "my application" }))
    ///     .nest("/streamhost", host.router());
    /// let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    /// let url = format!("http://{}", listener.local_addr()?);
    /// tokio::spawn(async move { axum::serve(listener, app).await });
    ///
    /// let answer = reqwest::Client::new()
    ///     .post(format!("{url}/streamhost/v1/projects/acme/streams/orders:append"))
    ///     .json(&serde_json::json!({"events": [{"type": "events.example/order-created"}]}))
    ///     .send()
    ///     .await?;
    /// assert_eq!(answer.status(), 200);
    /// # Ok(()) }
    /// ```
    pub fn router(&self) -> axum::Router {
        super::router(self.clone())
    }

    /// Serves the HTTP API on `listener` until `shutdown` resolves.
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> anyhow::Result<()> {
    /// # let dir = tempfile::tempdir()?;
    /// # let host = streamhost::Host::open(streamhost::Config { data_dir: dir.path().into(), ..Default::default() })?;
    /// let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    /// let url = format!("http://{}", listener.local_addr()?);
    /// let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    /// let server = tokio::spawn(host.serve(listener, async move {
    ///     let _ = stopped.await;
    /// }));
    ///
    /// let health = reqwest::get(format!("{url}/healthz")).await?;
    /// assert_eq!(health.status(), 200);
    /// stop.send(()).ok();
    /// server.await??;
    /// # Ok(()) }
    /// ```
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<()> {
        if self.auth.is_open() {
            tracing::warn!(
                "no tokens configured: the server runs open, every request acts as admin"
            );
        }
        let storage = self.streams.storage().clone();
        let streams = self.streams.clone();
        let limits = super::listener::Limits::from_config(&self.config.http, self.auth.is_open());
        let app = super::router(self);
        // Stopping hands this host's streams over at once (several hosts):
        // requests still in flight here finish or move with them.
        let shutdown = async move {
            shutdown.await;
            if storage.cluster().is_some() {
                match tokio::task::spawn_blocking(move || storage.release_leases()).await {
                    Ok(Ok(())) => {
                        tracing::info!("gave this host's streams up to the other hosts");
                        // Its live connections end (their clients reconnect
                        // through the new owners).
                        streams.lease_changed();
                    }
                    Ok(Err(e)) => {
                        tracing::warn!(error = %format!("{e:#}"), "giving this host's streams up failed: they move when its leases run out")
                    }
                    Err(_) => {}
                }
            }
        };
        super::listener::serve(listener, app, limits, shutdown).await;
        Ok(())
    }
}
