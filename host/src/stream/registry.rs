//! The registry of stream actors: finds the actor of an address, starting it
//! on first use, and forwards requests to it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, oneshot};

use super::actor::{self, ActorContext, AppendOutput, Command, ReadOutput, ReadQuery};
use super::address::StreamAddress;
use super::append::Authority;
use super::event::AppendInput;
use super::state::CoreState;
use crate::error::ApiError;

/// Requests queued per actor before senders wait (backpressure).
pub const MAILBOX_CAPACITY: usize = 4096;

/// All stream actors of a host. Cheap to clone.
#[derive(Clone)]
pub struct Streams {
    ctx: ActorContext,
    actors: Arc<Mutex<HashMap<StreamAddress, mpsc::Sender<Command>>>>,
}

impl Streams {
    pub fn new(ctx: ActorContext) -> Streams {
        Streams {
            ctx,
            actors: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    fn sender(&self, address: &StreamAddress) -> mpsc::Sender<Command> {
        let mut actors = self.actors.lock().expect("actor registry");
        if let Some(tx) = actors.get(address) {
            if !tx.is_closed() {
                return tx.clone();
            }
        }
        let (tx, rx) = mpsc::channel(MAILBOX_CAPACITY);
        actor::spawn(address.clone(), self.ctx.clone(), rx);
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

    /// Wipes a stream; the next touch starts a new lifetime.
    pub async fn reset(&self, address: &StreamAddress) -> Result<(), ApiError> {
        self.call(address, |reply| Command::Reset { reply }).await
    }
}
