//! HTTP connections: accepted up to `[http] max-connections` at a time
//! (more wait in the kernel's queue), each closed when it stalls.
//!
//! No client takes them all: one address (an IPv6 client's /64) holds at
//! most `max-connections-per-address`, and one more is answered `429
//! too-many-connections` and closed. With tokens configured, the last
//! `reserved-connections` places are for authenticated requests: a
//! connection given one carries [`Reserved`] on its requests, and the
//! middleware closes it on its first request without a valid token.
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

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, Ipv6Addr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tower::ServiceExt;

/// The bounds of connections (`[http]`).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub header_timeout: Duration,
    pub idle_timeout: Duration,
    pub max_connections: usize,
    pub max_connections_per_address: usize,
    /// Of `max_connections`, kept for authenticated requests (0 in open
    /// mode).
    pub reserved: usize,
}

impl Limits {
    /// `open`: no tokens are configured (nothing to reserve places for).
    pub fn from_config(c: &crate::config::HttpConfig, open: bool) -> Limits {
        Limits {
            header_timeout: Duration::from_millis(c.header_timeout_ms),
            idle_timeout: Duration::from_millis(c.idle_timeout_ms),
            max_connections: c.max_connections,
            max_connections_per_address: c.max_connections_per_address,
            reserved: if open { 0 } else { c.reserved() },
        }
    }
}

/// On every request of a connection that holds one of the places kept for
/// authenticated requests.
#[derive(Debug, Clone, Copy)]
pub struct Reserved;

/// Refused connections being answered at once, at most: beyond, one is
/// closed without an answer.
const REFUSALS_MAX: usize = 64;

/// How long a refused connection's request is read (and dropped) after its
/// answer, so that closing does not reset the answer away.
const REFUSAL_LINGER: Duration = Duration::from_millis(500);

/// The address a connection counts against: an IPv6 client's /64 (one
/// subscriber's network), an IPv4 client's address.
fn client_key(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => {
            let network = u128::from(v6) & !((1u128 << 64) - 1);
            IpAddr::V6(Ipv6Addr::from(network))
        }
        v4 => v4,
    }
}

/// Open connections per client address.
#[derive(Default)]
struct PerAddress(Mutex<HashMap<IpAddr, usize>>);

/// One connection's count against its address, given back when dropped.
struct AddressSlot {
    counts: Arc<PerAddress>,
    key: IpAddr,
}

impl PerAddress {
    /// A place for one more connection from `ip`, unless it holds `max`.
    fn take(self: &Arc<Self>, ip: IpAddr, max: usize) -> Option<AddressSlot> {
        let key = client_key(ip);
        let mut counts = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let count = counts.entry(key).or_insert(0);
        if *count >= max {
            return None;
        }
        *count += 1;
        Some(AddressSlot {
            counts: Arc::clone(self),
            key,
        })
    }
}

impl Drop for AddressSlot {
    fn drop(&mut self) {
        let mut counts = self.counts.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = counts.get_mut(&self.key) {
            *count -= 1;
            if *count == 0 {
                counts.remove(&self.key);
            }
        }
    }
}

/// Answers a connection from an address at its bound with `429` and closes
/// it (reading what it sent for a moment, so the answer is not reset away).
async fn refuse(mut tcp: TcpStream, ip: IpAddr, max: usize) {
    let body = serde_json::json!({"error": {
        "code": "too-many-connections",
        "message": format!(
            "{ip} already holds {max} open connections, the most one client address may \
             ([http] max-connections-per-address = {max}): close one, or reuse it"
        ),
    }})
    .to_string();
    let answer = format!(
        "HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\n\
         retry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let linger = async {
        tcp.write_all(answer.as_bytes()).await?;
        tcp.shutdown().await?;
        let mut sink = [0u8; 4096];
        while tcp.read(&mut sink).await? > 0 {}
        Ok::<_, std::io::Error>(())
    };
    let _ = tokio::time::timeout(REFUSAL_LINGER, linger).await;
}

/// Serves `app` on `listener` until `shutdown` resolves, then lets the open
/// connections finish their requests.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let open = Arc::new(Semaphore::new(limits.max_connections - limits.reserved));
    let reserve = Arc::new(Semaphore::new(limits.reserved));
    let refusals = Arc::new(Semaphore::new(REFUSALS_MAX));
    let per_address = Arc::new(PerAddress::default());
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        // A place open to anyone first; else one of the reserved ones.
        let (permit, reserved): (OwnedSemaphorePermit, bool) = tokio::select! {
            biased;
            () = &mut shutdown => break,
            p = Arc::clone(&open).acquire_owned() => (p.expect("never closed"), false),
            p = Arc::clone(&reserve).acquire_owned() => (p.expect("never closed"), true),
        };
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
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
        let max = limits.max_connections_per_address;
        let Some(slot) = per_address.take(peer.ip(), max) else {
            drop(permit);
            tracing::debug!(client = %peer.ip(), "refused a connection over the per-address bound");
            if let Ok(refusing) = Arc::clone(&refusals).try_acquire_owned() {
                tokio::spawn(async move {
                    refuse(tcp, peer.ip(), max).await;
                    drop(refusing);
                });
            }
            continue;
        };
        let (app, stop) = (app.clone(), stop_rx.clone());
        tokio::spawn(async move {
            connection(tcp, app, limits, stop, reserved).await;
            drop((permit, slot));
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

async fn connection(
    tcp: TcpStream,
    app: Router,
    limits: Limits,
    mut stop: watch::Receiver<bool>,
    reserved: bool,
) {
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
        hyper::service::service_fn(move |mut request: hyper::Request<Incoming>| {
            phase.request();
            if reserved {
                request.extensions_mut().insert(Reserved);
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ipv6_client_counts_by_its_64_and_a_mapped_ipv4_as_itself() {
        let key = |s: &str| client_key(s.parse().unwrap());
        assert_eq!(key("2001:db8:1:2:aaaa::1"), key("2001:db8:1:2:bbbb::2"));
        assert_ne!(key("2001:db8:1:2::1"), key("2001:db8:1:3::1"));
        assert_eq!(key("::ffff:10.0.0.7"), key("10.0.0.7"));
        assert_ne!(key("10.0.0.7"), key("10.0.0.8"));
    }

    #[test]
    fn an_address_holds_at_most_its_share_and_gets_places_back() {
        let counts = Arc::new(PerAddress::default());
        let ip: IpAddr = "10.0.0.7".parse().unwrap();
        let held: Vec<_> = (0..3).map(|_| counts.take(ip, 3).unwrap()).collect();
        assert!(counts.take(ip, 3).is_none());
        assert!(counts.take("10.0.0.8".parse().unwrap(), 3).is_some());
        drop(held);
        assert!(counts.take(ip, 3).is_some());
        assert!(
            counts.0.lock().unwrap().is_empty(),
            "no entry outlives its slots"
        );
    }
}
