//! Redaction of one event (`:redact`): its payload and metadata erased in
//! storage, recorded by an `event-redacted` line in the same commit.

use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::error::Error;
use crate::event::types;
use crate::stream::{AppendInput, Authority, Event, EventInput, ReadQuery, StreamAddress};

use super::request::{StreamAnswer, StreamRequest};
use super::Host;

/// The longest reason a redaction keeps, in bytes.
pub const REASON_BYTES_MAX: usize = 1024;

/// What redacting an event did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Redacted {
    /// The event as stored from now on: payload and metadata `null`,
    /// `redacted` saying when and why; offset, type and idempotency key
    /// unchanged.
    pub event: Event,
    /// The `event-redacted` line that records it on the stream.
    pub redacted_event: Event,
}

impl Host {
    /// Erases the payload and metadata of the event at `offset` of `stream`
    /// (a GDPR erasure, a leaked secret): storage keeps its offset, type,
    /// idempotency key and time, and a `redacted` mark with `reason`; an
    /// `event-redacted` line (`{offset, reason}`) is appended in the same
    /// commit. Nothing after it moves, a retry of its key still
    /// deduplicates, processors are not refolded (a verify reports the
    /// redactions it met), and copies of it on other streams keep theirs
    /// (redact them there). `404 event-not-found` for an offset that holds
    /// no stored event, `409 already-redacted`, `409 not-redactable` for
    /// the platform's own configuration events.
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> anyhow::Result<()> {
    /// # let dir = tempfile::tempdir()?;
    /// # let host = streamhost::Host::open(streamhost::Config { data_dir: dir.path().into(), ..Default::default() })?;
    /// use serde_json::json;
    /// use streamhost::EventInput;
    ///
    /// let users = host.stream("acme", "/users")?;
    /// let signed_up =
    ///     EventInput::new("events.example/signed-up").payload(json!({"email": "ada@example.com"}));
    /// let offset = host.append(&users, [signed_up]).await?.events[0].offset;
    /// let redacted = host.redact(&users, offset, "erasure request").await?;
    /// assert!(redacted.event.payload.is_empty());
    /// assert_eq!(redacted.event.redacted.unwrap().reason, "erasure request");
    /// # Ok(()) }
    /// ```
    pub async fn redact(
        &self,
        stream: &StreamAddress,
        offset: u64,
        reason: &str,
    ) -> Result<Redacted, Error> {
        let request = StreamRequest::Redact {
            offset,
            reason: reason.to_string(),
        };
        match self.apply(stream, request).await? {
            StreamAnswer::Redacted(x) => Ok(*x),
            other => Err(other.unexpected()),
        }
    }

    /// [`Host::redact`] on this host alone (see [`Host::apply`]).
    pub(crate) async fn redact_here(
        &self,
        stream: &StreamAddress,
        offset: u64,
        reason: &str,
    ) -> Result<Redacted, Error> {
        if reason.len() > REASON_BYTES_MAX {
            return Err(Error::invalid(format!(
                "reason is {} bytes, over the {REASON_BYTES_MAX}-byte limit",
                reason.len()
            )));
        }
        // A stream that does not exist has nothing to redact (and the
        // append below must not create it).
        self.streams.state(stream).await?;
        let line = EventInput::new(types::EVENT_REDACTED)
            .payload(json!({"offset": offset, "reason": reason}));
        let mut out = self
            .streams
            .append(
                stream,
                AppendInput {
                    events: vec![line],
                    expected_stream_id: None,
                },
                Authority::Platform,
            )
            .await?;
        let redacted_event = out.events.remove(0);
        let read = self
            .streams
            .read(
                stream,
                ReadQuery {
                    after_offset: offset.saturating_sub(1),
                    limit: 1,
                    include_ephemeral: false,
                },
            )
            .await?;
        let event = read
            .events
            .first()
            .map(|raw| serde_json::from_str::<Event>(raw.get()))
            .transpose()
            .map_err(|e| Error::internal(format!("reading the redacted event back: {e}")))?
            .filter(|e| e.offset == offset)
            .ok_or_else(|| {
                Error::internal(format!(
                    "the redacted event at offset {offset} was not read back"
                ))
            })?;
        Ok(Redacted {
            event,
            redacted_event,
        })
    }
}
