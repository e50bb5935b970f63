//! The registry of stream actors: finds the actor of an address, starting it
//! on first use, and forwards requests to it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::{mpsc, oneshot};

use super::actor::{self, ActorContext, AppendOutput, Command, ReadOutput, ReadQuery};
use super::address::StreamAddress;
use super::append::Authority;
use super::event::AppendInput;
use super::state::CoreState;
use crate::clock::Clock;
use crate::config::DeliveryConfig;
use crate::delivery::copy::{CopyBatch, CopyOutcome};
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::storage::Storage;

/// Requests queued per actor before senders wait (backpressure).
pub const MAILBOX_CAPACITY: usize = 4096;

/// All stream actors of a host. Cheap to clone.
#[derive(Clone)]
pub struct Streams {
    inner: Arc<Inner>,
}

/// A weak handle to the registry, held by actors.
#[derive(Clone)]
pub struct StreamsRef(Weak<Inner>);

impl StreamsRef {
    pub fn upgrade(&self) -> Option<Streams> {
        self.0.upgrade().map(|inner| Streams { inner })
    }
}

struct Inner {
    ctx: ActorContext,
    actors: Mutex<HashMap<StreamAddress, mpsc::Sender<Command>>>,
}

impl Streams {
    pub fn new(
        storage: Storage,
        clock: Arc<dyn Clock>,
        metrics: Metrics,
        delivery: DeliveryConfig,
        runtime: Arc<crate::processor::runtime::Runtime>,
    ) -> Streams {
        let inner = Arc::new_cyclic(|weak| Inner {
            ctx: ActorContext {
                storage,
                clock,
                metrics,
                delivery,
                runtime,
                streams: StreamsRef(weak.clone()),
            },
            actors: Mutex::new(HashMap::new()),
        });
        Streams { inner }
    }

    fn sender(&self, address: &StreamAddress) -> mpsc::Sender<Command> {
        let mut actors = self.inner.actors.lock().expect("actor registry");
        if let Some(tx) = actors.get(address) {
            if !tx.is_closed() {
                return tx.clone();
            }
        }
        let (tx, rx) = mpsc::channel(MAILBOX_CAPACITY);
        actor::spawn(address.clone(), self.inner.ctx.clone(), &tx, rx);
        actors.insert(address.clone(), tx.clone());
        tx
    }

    async fn call<T>(
        &self,
        address: &StreamAddress,
        make: impl FnOnce(oneshot::Sender<Result<T, ApiError>>) -> Command,
    ) -> Result<T, ApiError> {
        let (reply, rx) = oneshot::channel();
        self.sender(address)
            .send(make(reply))
            .await
            .map_err(|_| ApiError::internal(format!("the actor of stream {address} stopped")))?;
        rx.await.map_err(|_| {
            ApiError::internal(format!(
                "the actor of stream {address} stopped before answering"
            ))
        })?
    }

    /// Appends to a stream, creating it if needed.
    pub async fn append(
        &self,
        address: &StreamAddress,
        input: AppendInput,
        authority: Authority,
    ) -> Result<AppendOutput, ApiError> {
        self.call(address, |reply| Command::Append {
            input,
            authority,
            reply,
        })
        .await
    }

    /// Delivers a copy batch to a receiving stream.
    pub async fn deliver(
        &self,
        receiver: &StreamAddress,
        batch: CopyBatch,
    ) -> Result<CopyOutcome, ApiError> {
        self.call(receiver, |reply| Command::Deliver {
            batch: Box::new(batch),
            reply,
        })
        .await
    }

    /// Reads a page of events.
    pub async fn read(
        &self,
        address: &StreamAddress,
        query: ReadQuery,
    ) -> Result<ReadOutput, ApiError> {
        self.call(address, |reply| Command::Read { query, reply })
            .await
    }

    /// The reduced core state.
    pub async fn state(&self, address: &StreamAddress) -> Result<CoreState, ApiError> {
        self.call(address, |reply| Command::State { reply }).await
    }

    /// Runtime state: subscription delivery progress and connections.
    pub async fn runtime(&self, address: &StreamAddress) -> Result<serde_json::Value, ApiError> {
        self.call(address, |reply| Command::Runtime { reply }).await
    }

    /// Wipes a stream; the next touch starts a new lifetime.
    pub async fn reset(&self, address: &StreamAddress) -> Result<(), ApiError> {
        self.call(address, |reply| Command::Reset { reply }).await
    }

    /// Opens a live connection; its feed yields the replay, then live events.
    pub async fn connect(
        &self,
        address: &StreamAddress,
        params: crate::connection::ConnectParams,
    ) -> Result<crate::connection::feed::Feed, ApiError> {
        self.call(address, |reply| Command::Connect {
            params: Box::new(params),
            reply,
        })
        .await
    }

    /// The storage handle (for reads that need no actor).
    pub fn storage(&self) -> &Storage {
        &self.inner.ctx.storage
    }

    /// The wasm runtime.
    pub fn wasm_runtime(&self) -> &Arc<crate::processor::runtime::Runtime> {
        &self.inner.ctx.runtime
    }

    /// Loads a stream's actor so its deliveries resume.
    pub async fn wake(&self, address: &StreamAddress) {
        let _ = self.sender(address).send(Command::Wake).await;
    }
}
