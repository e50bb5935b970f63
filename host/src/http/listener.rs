//! HTTP connections: accepted up to `[http] max-connections` at a time
//! (more wait in the kernel's queue), each closed when it stalls.
//!
//! A connection is in one of three phases, and the phase's clock closes it:
//!
//! - **head**: from accept, or from the first byte of a request on a
//!   kept-alive connection, until the request head is whole:
//!   `header-timeout-ms`;
//! - **busy**: a request is being served (its response body included, a
//!   live connection's or a `waitForEvent`'s as long as it lasts): no clock;
//! - **idle**: between requests: `idle-timeout-ms`.
//!
//! A request body is bounded where it is read (`body-timeout-ms`, in the
//! handlers). Hyper itself runs without timers.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};
use tower::ServiceExt;

/// The bounds of connections (`[http]`).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub header_timeout: Duration,
    pub idle_timeout: Duration,
    pub max_connections: usize,
}

impl Limits {
    pub fn from_config(c: &crate::config::HttpConfig) -> Limits {
        Limits {
            header_timeout: Duration::from_millis(c.header_timeout_ms),
            idle_timeout: Duration::from_millis(c.idle_timeout_ms),
            max_connections: c.max_connections,
        }
    }
}

/// Serves `app` on `listener` until `shutdown` resolves, then lets the open
/// connections finish their requests.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            p = Arc::clone(&permits).acquire_owned() => p.expect("the semaphore is never closed"),
            () = &mut shutdown => break,
        };
        let tcp = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => tcp,
                Err(e) => {
                    // Out of file descriptors and the like: wait, then go on.
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        // Answers are small and latency-bound: no Nagle delay.
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::warn!(error = %e, "setting TCP_NODELAY failed");
        }
        let (app, stop) = (app.clone(), stop_rx.clone());
        tokio::spawn(async move {
            connection(tcp, app, limits, stop).await;
            drop(permit);
        });
    }
    drop(listener);
    drop(stop_rx);
    let _ = stop_tx.send(true);
    // Every connection holds a receiver until it ends.
    stop_tx.closed().await;
}

/// One connection's phase, shared by its socket, its requests and its clock.
struct Phase {
    started: Instant,
    /// Requests being served (their responses not yet all sent).
    busy: AtomicUsize,
    /// A request head is being read (set at accept and by the first byte
    /// read while not busy, cleared when the head is whole).
    reading_head: AtomicBool,
    /// When the current phase began, in ms since `started`.
    since_ms: AtomicU64,
}

impl Phase {
    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    fn enter(&self) {
        self.since_ms.store(self.now_ms(), Ordering::Relaxed);
    }

    /// Bytes arrived from the client.
    fn read(&self) {
        if self.busy.load(Ordering::Relaxed) == 0
            && !self.reading_head.swap(true, Ordering::Relaxed)
        {
            self.enter();
        }
    }

    /// A request head is whole: its request is being served.
    fn request(&self) {
        self.busy.fetch_add(1, Ordering::Relaxed);
        self.reading_head.store(false, Ordering::Relaxed);
    }

    /// A response was sent (or dropped).
    fn responded(&self) {
        if self.busy.fetch_sub(1, Ordering::Relaxed) == 1 {
            self.enter();
        }
    }

    /// When the current phase's clock runs out; `None` while busy.
    fn deadline(&self, limits: &Limits) -> Option<Instant> {
        if self.busy.load(Ordering::Relaxed) > 0 {
            return None;
        }
        let allowed = if self.reading_head.load(Ordering::Relaxed) {
            limits.header_timeout
        } else {
            limits.idle_timeout
        };
        let since = Duration::from_millis(self.since_ms.load(Ordering::Relaxed));
        Some(self.started + since + allowed)
    }
}

async fn connection(tcp: TcpStream, app: Router, limits: Limits, mut stop: watch::Receiver<bool>) {
    let phase = Arc::new(Phase {
        started: Instant::now(),
        busy: AtomicUsize::new(0),
        reading_head: AtomicBool::new(true),
        since_ms: AtomicU64::new(0),
    });
    let io = TokioIo::new(Watched {
        inner: tcp,
        phase: Arc::clone(&phase),
    });
    let service = {
        let phase = Arc::clone(&phase);
        hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
            phase.request();
            let guard = Responded(Arc::clone(&phase));
            let app = app.clone();
            async move {
                let response = app
                    .oneshot(request.map(Body::new))
                    .await
                    .unwrap_or_else(|e| match e {});
                Ok::<_, std::convert::Infallible>(response.map(|body| {
                    Body::new(Tracked {
                        body,
                        _guard: guard,
                    })
                }))
            }
        })
    };
    let conn = hyper::server::conn::http1::Builder::new()
        .keep_alive(true)
        .serve_connection(io, service);
    let mut conn = std::pin::pin!(conn);
    let mut stopping = *stop.borrow();
    if stopping {
        conn.as_mut().graceful_shutdown();
    }
    // One clock per connection, set to the current phase's deadline when it
    // rings (requests never wake this task): while busy it checks again a
    // period later; a phase that changed meanwhile is seen then.
    let period = limits.header_timeout.min(limits.idle_timeout);
    let mut clock = std::pin::pin!(tokio::time::sleep(limits.header_timeout));
    loop {
        tokio::select! {
            result = conn.as_mut() => {
                if let Err(e) = result {
                    tracing::debug!(error = %e, "a connection ended with an error");
                }
                return;
            }
            () = clock.as_mut() => {
                let next = match phase.deadline(&limits) {
                    // Expired: close the connection by dropping it.
                    Some(at) if at <= Instant::now() => return,
                    Some(at) => at,
                    None => Instant::now() + period,
                };
                clock.as_mut().reset(next.into());
            }
            changed = stop.changed(), if !stopping => {
                if changed.is_err() || *stop.borrow() {
                    stopping = true;
                    conn.as_mut().graceful_shutdown();
                }
            }
        }
    }
}

/// The socket, telling the connection's phase when bytes arrive.
struct Watched {
    inner: TcpStream,
    phase: Arc<Phase>,
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let result = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(result, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.phase.read();
        }
        result
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// Marks its request answered when dropped (its response body sent, or the
/// connection gone).
struct Responded(Arc<Phase>);

impl Drop for Responded {
    fn drop(&mut self) {
        self.0.responded();
    }
}

/// A response body that holds its request's [`Responded`] until it ends.
struct Tracked {
    body: Body,
    _guard: Responded,
}

impl hyper::body::Body for Tracked {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}
