//! The registry of stream actors: finds the actor of an address, starting it
//! on first use, and forwards requests to it. An idle actor leaves the
//! registry by itself ([`Streams::release`]); a request that raced with its
//! release is handed to the stream's next actor, so none is lost.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::{mpsc, oneshot};

use super::remote;
use super::{ActorContext, Command};
use crate::clock::Clock;
use crate::config::DeliveryConfig;
use crate::delivery::copy::{CopyBatch, CopyOutcome};
use crate::error::Error;
use crate::metrics::Metrics;
use crate::storage::Storage;
use crate::stream::{
    AppendInput, AppendOutput, Authority, CoreState, ReadOutput, ReadQuery, StreamAddress,
};

/// Requests queued per actor before senders wait (backpressure).
pub const MAILBOX_CAPACITY: usize = 4096;

/// What every stream actor is configured with.
#[derive(Clone)]
pub struct StreamSettings {
    /// Delivery settings.
    pub delivery: DeliveryConfig,
    /// The webhook client.
    pub webhooks: crate::executor::webhook::Client,
    /// `[limits] idle-stream-ms`.
    pub idle_stream_ms: u64,
    /// `[limits] max-live-connections-per-project`.
    pub max_live_connections_per_project: usize,
    /// `[limits] max-ephemeral-bytes`.
    pub max_ephemeral_bytes: usize,
    /// `[limits] max-project-bytes`: what each project stores, counted.
    pub stored: Arc<crate::quota::StoredBytes>,
    /// Guest calls at once, per project and in all (`[processors]`).
    pub calls: Arc<crate::processor::share::Shares>,
    /// Webhook POSTs at once per destination (`[effects]
    /// per-destination-concurrency`).
    pub destinations: Arc<crate::processor::share::Shares>,
    /// What the configuration bounds in deliveries' evaluations.
    pub bounds: crate::delivery::Bounds,
    /// Trace spans for the OTLP endpoint.
    pub telemetry: crate::telemetry::Telemetry,
}

/// All stream actors of a host. Cheap to clone.
#[derive(Clone)]
pub struct Streams {
    inner: Arc<Inner>,
}

/// A weak handle to the registry, held by actors.
#[derive(Clone)]
pub struct StreamsRef(Weak<Inner>);

impl StreamsRef {
    /// The registry, if it still exists.
    pub fn upgrade(&self) -> Option<Streams> {
        self.0.upgrade().map(|inner| Streams { inner })
    }

    fn open(&self) -> Result<Streams, Error> {
        self.upgrade()
            .ok_or_else(|| Error::unavailable("host-closing", "the host is shutting down", 1))
    }
}

impl crate::executor::Streams for StreamsRef {
    fn executors(&self) -> Option<crate::executor::Executors> {
        self.upgrade().map(|streams| streams.executors().clone())
    }

    fn append<'a>(
        &'a self,
        address: &'a StreamAddress,
        input: AppendInput,
        authority: Authority,
    ) -> crate::executor::Answer<'a, AppendOutput> {
        Box::pin(async move { self.open()?.append(address, input, authority).await })
    }

    fn deliver<'a>(
        &'a self,
        receiver: &'a StreamAddress,
        batch: CopyBatch,
    ) -> crate::executor::Answer<'a, CopyOutcome> {
        Box::pin(async move { self.open()?.deliver(receiver, batch).await })
    }
}

struct Inner {
    ctx: ActorContext,
    /// Calls on streams another host owns (several hosts).
    remote: reqwest::Client,
    actors: Mutex<HashMap<StreamAddress, Entry>>,
    /// Live connections per project.
    live: Arc<crate::quota::LiveConnections>,
    /// Whether the idle sweep runs (started with the first actor).
    sweeping: std::sync::atomic::AtomicBool,
}

/// An actor in the registry.
struct Entry {
    tx: mpsc::Sender<Command>,
    /// When a request was last routed to it.
    last_used: std::time::Instant,
}

impl Streams {
    /// A weak handle (what a background task holds: it does not keep a
    /// closing host alive).
    pub fn downgrade(&self) -> StreamsRef {
        StreamsRef(Arc::downgrade(&self.inner))
    }

    /// A registry over `storage`.
    pub fn new(
        storage: Storage,
        clock: Arc<dyn Clock>,
        metrics: Metrics,
        settings: StreamSettings,
        runtime: Arc<crate::processor::runtime::Runtime>,
    ) -> Streams {
        let inner = Arc::new_cyclic(|weak| Inner {
            ctx: ActorContext {
                executors: crate::executor::Executors {
                    storage: storage.clone(),
                    streams: Arc::new(StreamsRef(weak.clone())),
                    runtime: runtime.clone(),
                    webhooks: settings.webhooks,
                    effects: Default::default(),
                    refolds: Default::default(),
                    shadows: Default::default(),
                    metrics: metrics.clone(),
                    calls: settings.calls,
                    sends: crate::processor::share::Shares::new(
                        settings.delivery.concurrency,
                        settings.delivery.project_concurrency(),
                    ),
                    bounds: settings.bounds,
                    telemetry: settings.telemetry,
                    wakes_ended: Default::default(),
                    effects_ended: Default::default(),
                    secrets: Default::default(),
                    clock: clock.clone(),
                    destinations: settings.destinations,
                    stored: settings.stored.clone(),
                },
                storage,
                clock,
                metrics,
                delivery: settings.delivery,
                runtime,
                streams: StreamsRef(weak.clone()),
                idle_stream_ms: settings.idle_stream_ms,
                ephemeral: crate::quota::EphemeralMemory::new(settings.max_ephemeral_bytes),
                stored: settings.stored,
                reactor_rests: Default::default(),
            },
            live: crate::quota::LiveConnections::new(settings.max_live_connections_per_project),
            actors: Mutex::new(HashMap::new()),
            sweeping: std::sync::atomic::AtomicBool::new(false),
            remote: reqwest::Client::builder()
                .connect_timeout(std::time::Duration::from_secs(2))
                .build()
                .unwrap_or_default(),
        });
        Streams { inner }
    }

    /// The lag of every delivery run of the streams in memory now: (stream,
    /// subscription key, events after its cursor). An actor too busy to
    /// answer within a second is left out; none is loaded or kept in memory
    /// by the asking.
    pub async fn lags(&self) -> Vec<(String, String, u64)> {
        let actors: Vec<(StreamAddress, mpsc::Sender<Command>)> = self
            .inner
            .actors
            .lock()
            .expect("actor registry")
            .iter()
            .map(|(a, e)| (a.clone(), e.tx.clone()))
            .collect();
        let asked = actors.into_iter().filter_map(|(address, tx)| {
            let (reply, rx) = oneshot::channel();
            tx.try_send(Command::Lags { reply }).ok()?;
            Some(async move {
                let lags = tokio::time::timeout(std::time::Duration::from_secs(1), rx)
                    .await
                    .ok()?
                    .ok()?;
                Some((address, lags))
            })
        });
        let mut out = Vec::new();
        for (address, lags) in futures_util::future::join_all(asked)
            .await
            .into_iter()
            .flatten()
        {
            let stream = address.to_string();
            out.extend(
                lags.into_iter()
                    .map(|(key, lag)| (stream.clone(), key, lag)),
            );
        }
        out
    }

    /// Stream actors in memory now.
    pub fn actors(&self) -> usize {
        self.inner.actors.lock().map(|a| a.len()).unwrap_or(0)
    }

    /// Every half idle period, asks the actors that no request reached for
    /// the whole period whether they may go (`Command::IdleCheck`). One
    /// timer for the host, not one per actor; ends with the registry.
    fn start_idle_sweep(&self) {
        use std::sync::atomic::Ordering;
        if self.inner.sweeping.swap(true, Ordering::AcqRel) {
            return;
        }
        let weak = Arc::downgrade(&self.inner);
        let idle = std::time::Duration::from_millis(self.inner.ctx.idle_stream_ms);
        let period = (idle / 2).max(std::time::Duration::from_millis(10));
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(inner) = weak.upgrade() else { return };
                let now = std::time::Instant::now();
                let idle_ones: Vec<mpsc::Sender<Command>> = inner
                    .actors
                    .lock()
                    .expect("actor registry")
                    .values()
                    .filter(|e| now.duration_since(e.last_used) >= idle)
                    .map(|e| e.tx.clone())
                    .collect();
                drop(inner);
                for tx in idle_ones {
                    // A full mailbox is a busy actor: not idle.
                    let _ = tx.try_send(Command::IdleCheck);
                }
            }
        });
    }

    /// Removes the actor `me` of `address` from the registry, unless a
    /// message is waiting in its mailbox. Called by the actor itself when it
    /// is idle; once it returns `true`, no new request can reach `me`.
    pub(super) fn release(
        &self,
        address: &StreamAddress,
        me: &mpsc::Sender<Command>,
        rx: &mpsc::Receiver<Command>,
    ) -> bool {
        let mut actors = self.inner.actors.lock().expect("actor registry");
        if !rx.is_empty() {
            return false;
        }
        match actors.get(address) {
            Some(e) if e.tx.same_channel(me) => {
                actors.remove(address);
                self.inner.ctx.metrics.stream_actors_add(-1);
                if actors.capacity() > 64 && actors.len() < actors.capacity() / 4 {
                    actors.shrink_to_fit();
                }
                true
            }
            _ => false,
        }
    }

    /// Hands a message that reached a released actor to the stream's
    /// current actor.
    pub(super) async fn forward(&self, address: &StreamAddress, cmd: Command) {
        let _ = self.send(address, cmd).await;
    }

    /// Sends to the actor of `address`; when that actor has just released
    /// itself, to its successor.
    async fn send(&self, address: &StreamAddress, mut cmd: Command) -> Result<(), Error> {
        for _ in 0..8 {
            match self.sender(address).send(cmd).await {
                Ok(()) => return Ok(()),
                Err(mpsc::error::SendError(back)) => cmd = back,
            }
        }
        Err(Error::internal(format!(
            "the actor of stream {address} stopped"
        )))
    }

    fn sender(&self, address: &StreamAddress) -> mpsc::Sender<Command> {
        let now = std::time::Instant::now();
        let mut actors = self.inner.actors.lock().expect("actor registry");
        if let Some(e) = actors.get_mut(address) {
            if !e.tx.is_closed() {
                e.last_used = now;
                return e.tx.clone();
            }
            // Its actor ended without releasing itself: replaced below.
            self.inner.ctx.metrics.stream_actors_add(-1);
        }
        let (tx, rx) = mpsc::channel(MAILBOX_CAPACITY);
        super::spawn(address.clone(), self.inner.ctx.clone(), &tx, rx);
        self.inner.ctx.metrics.stream_actors_add(1);
        actors.insert(
            address.clone(),
            Entry {
                tx: tx.clone(),
                last_used: now,
            },
        );
        drop(actors);
        self.start_idle_sweep();
        tx
    }

    async fn call<T>(
        &self,
        address: &StreamAddress,
        make: impl FnOnce(oneshot::Sender<Result<T, Error>>) -> Command,
    ) -> Result<T, Error> {
        let (reply, rx) = oneshot::channel();
        self.send(address, make(reply)).await?;
        rx.await.map_err(|_| {
            Error::internal(format!(
                "the actor of stream {address} stopped before answering"
            ))
        })?
    }

    /// Appends to a stream, creating it if needed; on a stream another host
    /// owns, through that host.
    pub async fn append(
        &self,
        address: &StreamAddress,
        input: AppendInput,
        authority: Authority,
    ) -> Result<AppendOutput, Error> {
        let again = self.inner.ctx.storage.cluster().map(|_| input.clone());
        match (self.append_here(address, input, authority).await, again) {
            (Err(e), Some(input)) if e.owner_url.is_some() => {
                self.remote(address, e, remote::Call::Append { input, authority })
                    .await
            }
            (result, _) => result,
        }
    }

    /// Appends through this host's actor only (a call another host sent).
    pub async fn append_here(
        &self,
        address: &StreamAddress,
        input: AppendInput,
        authority: Authority,
    ) -> Result<AppendOutput, Error> {
        self.call(address, |reply| Command::Append {
            input,
            authority,
            reply,
        })
        .await
    }

    /// Delivers a copy batch to a receiving stream; on a stream another
    /// host owns, through that host.
    pub async fn deliver(
        &self,
        receiver: &StreamAddress,
        batch: CopyBatch,
    ) -> Result<CopyOutcome, Error> {
        let again = self.inner.ctx.storage.cluster().map(|_| CopyBatch {
            shaped: None,
            ..batch.clone()
        });
        match (self.deliver_here(receiver, batch).await, again) {
            (Err(e), Some(batch)) if e.owner_url.is_some() => {
                self.remote(receiver, e, remote::Call::Deliver { batch })
                    .await
            }
            (result, _) => result,
        }
    }

    /// Delivers through this host's actor only (a call another host sent).
    pub async fn deliver_here(
        &self,
        receiver: &StreamAddress,
        batch: CopyBatch,
    ) -> Result<CopyOutcome, Error> {
        self.call(receiver, |reply| Command::Deliver {
            batch: Box::new(batch),
            reply,
        })
        .await
    }

    /// Sends `call` to the owner named by `elsewhere` (an
    /// owned-elsewhere error), or answers that error.
    async fn remote<T: serde::de::DeserializeOwned>(
        &self,
        address: &StreamAddress,
        elsewhere: Error,
        call: remote::Call,
    ) -> Result<T, Error> {
        let wait = self
            .inner
            .ctx
            .storage
            .cluster()
            .map(|me| std::time::Duration::from_millis(me.lease_ms.max(5000) as u64))
            .unwrap_or_default();
        self.call_owner(address, elsewhere, call, wait).await
    }

    /// Sends `call` to the owner named by `elsewhere` (an owned-elsewhere
    /// error), waiting at most `wait` for its answer; or answers that
    /// error (no owner to send it to).
    pub async fn call_owner<T: serde::de::DeserializeOwned>(
        &self,
        address: &StreamAddress,
        elsewhere: Error,
        call: remote::Call,
        wait: std::time::Duration,
    ) -> Result<T, Error> {
        let Some(me) = self.inner.ctx.storage.cluster() else {
            return Err(elsewhere);
        };
        let url = elsewhere.owner_url.clone().unwrap_or_default();
        if url.is_empty() || url == me.url {
            return Err(elsewhere);
        }
        remote::send(&self.inner.remote, &me.secret, wait, &url, address, call).await
    }

    /// This host's lease on a stream (loading it first): what a write made
    /// outside the actor (a refold's switch) carries. `None` on SQLite.
    pub async fn fence(
        &self,
        address: &StreamAddress,
    ) -> Result<Option<crate::storage::Fence>, Error> {
        self.call(address, |reply| Command::Fence { reply }).await
    }

    /// Reads a page of events.
    pub async fn read(
        &self,
        address: &StreamAddress,
        query: ReadQuery,
    ) -> Result<ReadOutput, Error> {
        self.call(address, |reply| Command::Read { query, reply })
            .await
    }

    /// The reduced core state.
    pub async fn state(&self, address: &StreamAddress) -> Result<CoreState, Error> {
        self.call(address, |reply| Command::State { reply }).await
    }

    /// Retries at once the failing (not halted) runs of subscription `key`,
    /// or of every subscription calling `component`; on a stream another
    /// host owns, through that host. Answers the keys that retry.
    pub async fn retry(
        &self,
        address: &StreamAddress,
        key: Option<&str>,
        component: Option<&str>,
    ) -> Result<Vec<String>, Error> {
        let (key, component) = (key.map(str::to_string), component.map(str::to_string));
        match self
            .retry_here(address, key.clone(), component.clone())
            .await
        {
            // (With no other host, `remote` answers the error itself.)
            Err(e) if e.owner_url.is_some() => {
                self.remote(address, e, remote::Call::Retry { key, component })
                    .await
            }
            result => result,
        }
    }

    /// Resumes subscription `key` of `address` (`:resumeSubscription`): a
    /// failing one is retried at once (answers `None`); a halted one is
    /// resumed by a `subscription-delivery-resumed` event (answered).
    /// `idempotency_key` (the event's) makes that resume happen once however
    /// often it is asked for. On a stream another host owns, through that
    /// host.
    pub async fn resume_subscription(
        &self,
        address: &StreamAddress,
        key: &str,
        idempotency_key: Option<String>,
    ) -> Result<Option<crate::stream::Event>, Error> {
        match self.retry(address, Some(key), None).await {
            Ok(keys) if !keys.is_empty() => return Ok(None),
            Err(e) if e.owner_url.is_some() => return Err(e),
            _ => {}
        }
        let mut resumed =
            crate::stream::EventInput::new(crate::stream::types::SUBSCRIPTION_DELIVERY_RESUMED)
                .payload(serde_json::json!({"subscriptionKey": key}));
        resumed.idempotency_key = idempotency_key;
        let input = AppendInput {
            events: vec![resumed],
            expected_stream_id: None,
        };
        let mut out = self.append(address, input, Authority::Public).await?;
        Ok(Some(out.events.remove(0)))
    }

    /// [`Streams::retry`] through this host's actor only.
    pub async fn retry_here(
        &self,
        address: &StreamAddress,
        key: Option<String>,
        component: Option<String>,
    ) -> Result<Vec<String>, Error> {
        self.call(address, |reply| Command::Retry {
            key,
            component,
            reply,
        })
        .await
    }

    /// Runtime state: subscription delivery progress and connections.
    pub async fn runtime(&self, address: &StreamAddress) -> Result<super::RuntimeView, Error> {
        self.call(address, |reply| Command::Runtime { reply }).await
    }

    /// Wipes a stream; the next touch starts a new lifetime.
    pub async fn reset(&self, address: &StreamAddress) -> Result<(), Error> {
        self.call(address, |reply| Command::Reset { reply }).await
    }

    /// Opens a live connection; its feed yields the replay, then live events.
    pub async fn connect(
        &self,
        address: &StreamAddress,
        params: crate::connection::ConnectParams,
    ) -> Result<crate::connection::feed::Feed, Error> {
        // Counted on the host that serves the connection (its owner).
        let project = address.namespace.project_id().unwrap_or("").to_string();
        let slot = self.inner.live.take(&project)?;
        let mut feed = self
            .call(address, |reply| Command::Connect {
                params: Box::new(params),
                reply,
            })
            .await?;
        feed.slot = Some(slot);
        Ok(feed)
    }

    /// The storage handle (for reads that need no actor).
    pub fn storage(&self) -> &Storage {
        &self.inner.ctx.storage
    }

    /// The injected clock's time, ms since the epoch.
    pub fn now_ms(&self) -> i64 {
        self.inner.ctx.clock.now_ms()
    }

    /// The injected clock.
    pub fn clock(&self) -> Arc<dyn Clock> {
        Arc::clone(&self.inner.ctx.clock)
    }

    /// What delivery jobs and effects execute with.
    pub fn executors(&self) -> &crate::executor::Executors {
        &self.inner.ctx.executors
    }

    /// The bytes each project's stored events take, against its bound.
    pub fn stored(&self) -> &Arc<crate::quota::StoredBytes> {
        &self.inner.ctx.stored
    }

    /// The wasm runtime.
    pub fn wasm_runtime(&self) -> &Arc<crate::processor::runtime::Runtime> {
        &self.inner.ctx.runtime
    }

    /// Tells every actor in memory that this host's right to serve its
    /// streams changed (several hosts): lapsed, renewed, or renewed after
    /// the database let it expire.
    pub fn lease_changed(&self) {
        let senders: Vec<mpsc::Sender<Command>> = self
            .inner
            .actors
            .lock()
            .expect("actor registry")
            .values()
            .map(|e| e.tx.clone())
            .collect();
        for tx in senders {
            if let Err(mpsc::error::TrySendError::Full(cmd)) = tx.try_send(Command::LeaseChanged) {
                // A busy actor hears it after its queue.
                tokio::spawn(async move {
                    let _ = tx.send(cmd).await;
                });
            }
        }
    }

    /// Loads a stream's actor so its deliveries resume.
    pub async fn wake(&self, address: &StreamAddress) {
        let _ = self.send(address, Command::Wake).await;
    }
}
