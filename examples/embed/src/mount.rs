//! The HTTP API inside an application's own axum server, under a prefix:
//! `cargo run -p streamhost-example-embed -- mount` serves it at
//! `http://127.0.0.1:8080/streamhost` (the console at
//! `/streamhost/console`) beside the application's own routes.

use axum::routing::get;
use axum::Router;
use streamhost::Host;

/// The application: its own routes, and streamhost's under `/streamhost`.
pub fn app(host: &Host) -> Router {
    Router::new()
        .route(
            "/",
            get(|| async { "my application; streamhost is at /streamhost" }),
        )
        .nest("/streamhost", host.router())
}

/// Serves [`app`] on `listener` until the process stops.
pub async fn serve(host: Host, listener: tokio::net::TcpListener) -> anyhow::Result<()> {
    axum::serve(listener, app(&host)).await?;
    Ok(())
}
