//! The Durable Streams protocol over this host's streams (`/ds/...`): the
//! typed operations the HTTP adapter (`http/durable.rs`) maps to the
//! protocol's headers and statuses. The rules are the core's
//! (`stream::durable`); here they meet the stream's actor: each write
//! reads the stream's state, decides, and appends, one at a time per
//! stream on its owner (a producer's check and its append are one step).
//! On several hosts the HTTP layer carries the request to the stream's
//! owner first, so every call here is on this host's own actor.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use axum::body::Bytes;

use super::live::{Connect, Live, LiveConnection};
use super::Host;
use crate::error::{Error, ErrorKind};
use crate::stream::durable::{
    self, Created, DurableStream, ProducerCheck, ProducerStamp, Provenance, ReadFrom,
};
use crate::stream::{
    AppendInput, Authority, CoreState, Event, EventInput, ReadQuery, StreamAddress,
};

/// The most events a read looks at before it answers (the protocol lets
/// a server bound its chunks; `Stream-Up-To-Date` is then left off).
const READ_EVENTS_MAX: usize = 2000;
/// The most bytes a read answers, past its first event.
const READ_BYTES_MAX: usize = 4 * 1024 * 1024;

/// Per-stream serialization of protocol writes, and when each stream with
/// a TTL was last read or written.
#[derive(Default)]
pub(crate) struct DurableStreams {
    locks: Mutex<HashMap<StreamAddress, Weak<tokio::sync::Mutex<()>>>>,
    accessed: Mutex<HashMap<StreamAddress, i64>>,
}

impl DurableStreams {
    fn lock_of(&self, stream: &StreamAddress) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.locks.lock().expect("durable locks");
        if let Some(lock) = locks.get(stream).and_then(Weak::upgrade) {
            return lock;
        }
        locks.retain(|_, w| w.strong_count() > 0);
        let lock = Arc::new(tokio::sync::Mutex::new(()));
        locks.insert(stream.clone(), Arc::downgrade(&lock));
        lock
    }
}

/// `PUT`: a stream's configuration, whether it is created closed, and its
/// first content.
#[derive(Debug, Clone)]
pub struct DurableCreate {
    /// Content type and lifetime.
    pub config: Created,
    /// `Stream-Closed: true`.
    pub closed: bool,
    /// The initial bytes (may be empty).
    pub body: Bytes,
}

/// `POST`: content (or none, to close only), its content type, and the
/// request's producer and sequence.
#[derive(Debug, Clone)]
pub struct DurableAppend {
    /// `Content-Type`.
    pub content_type: Option<String>,
    /// The bytes.
    pub body: Bytes,
    /// `Stream-Closed: true`.
    pub close: bool,
    /// `Producer-Id`, `Producer-Epoch`, `Producer-Seq`.
    pub producer: Option<ProducerStamp>,
    /// `Stream-Seq`.
    pub stream_seq: Option<String>,
}

/// What an append did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Appended {
    /// Committed; the stream's tail after it.
    Done {
        /// `Stream-Next-Offset`.
        tail: u64,
        /// The stream is closed now.
        closed: bool,
    },
    /// The producer's request was appended before: nothing appended.
    Duplicate {
        /// The highest sequence number accepted in the epoch.
        last_seq: u64,
        /// The stream's tail.
        tail: u64,
        /// The stream is closed.
        closed: bool,
    },
    /// A zombie's epoch (`403`).
    StaleEpoch {
        /// The producer's current epoch.
        current: u64,
    },
    /// A new epoch not at sequence 0 (`400`).
    NewEpochNotAtZero,
    /// A gap in the producer's sequence (`409`).
    Gap {
        /// The next sequence number.
        expected: u64,
        /// The one sent.
        received: u64,
    },
    /// The stream is closed (`409`).
    Closed {
        /// Its final tail.
        tail: u64,
    },
}

/// A page of a stream as the protocol reads it.
#[derive(Debug, Clone)]
pub struct DurablePage {
    /// The stream as it was when read.
    pub stream: DurableStream,
    /// The events a reader sees, in order.
    pub events: Vec<Event>,
    /// `Stream-Next-Offset`.
    pub next: u64,
    /// Every event up to the tail is in the page.
    pub up_to_date: bool,
}

impl DurablePage {
    /// Whether the reader is at the end of a closed stream.
    pub fn at_closed_end(&self) -> bool {
        self.stream.closed && self.up_to_date && self.next >= self.stream.tail
    }
}

fn not_found(stream: &StreamAddress) -> Error {
    Error::not_found(
        "stream-not-found",
        format!("no Durable Streams stream at {:?}", stream.path),
    )
}

impl Host {
    /// The stream's protocol state if it exists, has not expired and was
    /// created through the protocol.
    async fn durable_state(&self, stream: &StreamAddress) -> Result<Option<CoreState>, Error> {
        let state = match self.state_here(stream).await {
            Ok(s) => s,
            Err(e) if e.kind == ErrorKind::NotFound && e.code == "stream-not-found" => {
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
        let Some(d) = &state.durable_stream else {
            return Ok(Some(state));
        };
        if self.expired(stream, d) {
            return Ok(Some(CoreState {
                durable_stream: None,
                ..state
            }));
        }
        Ok(Some(state))
    }

    /// Whether `d` is past its expiry now.
    fn expired(&self, stream: &StreamAddress, d: &DurableStream) -> bool {
        let written = chrono::DateTime::parse_from_rfc3339(&d.last_appended_at)
            .map(|t| t.timestamp_millis())
            .unwrap_or(0);
        let accessed = self
            .durable
            .accessed
            .lock()
            .expect("durable access times")
            .get(stream)
            .copied()
            .unwrap_or(0);
        d.expires_at_ms(written.max(accessed))
            .is_some_and(|at| self.streams.now_ms() >= at)
    }

    /// Records a read or a write of a stream with a TTL (HEAD is neither).
    fn touch(&self, stream: &StreamAddress, d: &DurableStream) {
        if d.ttl_seconds.is_some() {
            let now = self.streams.now_ms();
            self.durable
                .accessed
                .lock()
                .expect("durable access times")
                .insert(stream.clone(), now);
        }
    }

    /// `HEAD`: the stream's protocol state.
    pub async fn durable_head(&self, stream: &StreamAddress) -> Result<DurableStream, Error> {
        self.durable_state(stream)
            .await?
            .and_then(|s| s.durable_stream)
            .ok_or_else(|| not_found(stream))
    }

    /// `PUT`: creates the stream (`true`) or finds it created with the same
    /// configuration (`false`); another configuration is `409`.
    pub async fn durable_create(
        &self,
        stream: &StreamAddress,
        create: DurableCreate,
    ) -> Result<(bool, DurableStream), Error> {
        let lock = self.durable.lock_of(stream);
        let _serial = lock.lock().await;
        if let Some(existing) = self
            .durable_state(stream)
            .await?
            .and_then(|s| s.durable_stream)
        {
            if create.config.matches(&existing, create.closed) {
                self.touch(stream, &existing);
                return Ok((false, existing));
            }
            return Err(Error::conflict(
                "stream-exists",
                format!(
                    "a stream exists at {:?} with another configuration (content type {:?}, \
                     TTL {:?}, expiry {:?}, closed {})",
                    stream.path,
                    existing.content_type,
                    existing.ttl_seconds,
                    existing.expires_at,
                    existing.closed
                ),
            ));
        }
        let json = durable::is_json(&create.config.content_type);
        let mut events = vec![create.config.event()];
        let none = Provenance::default();
        if json {
            if !create.body.is_empty() {
                for m in durable::json_messages(&create.body, true)? {
                    events.push(durable::json_message_event(m, &none));
                }
            }
        } else if !create.body.is_empty() {
            events.push(durable::bytes_message_event(&create.body, &none));
        }
        if create.closed {
            events.push(durable::closed_event(None));
        }
        self.durable_write(stream, events).await?;
        let created = self.durable_head(stream).await?;
        self.touch(stream, &created);
        Ok((true, created))
    }

    /// `POST`: appends (or closes), a producer's request checked against
    /// the producer's state in the same step.
    pub async fn durable_append(
        &self,
        stream: &StreamAddress,
        append: DurableAppend,
    ) -> Result<Appended, Error> {
        let lock = self.durable.lock_of(stream);
        let _serial = lock.lock().await;
        let d = self.durable_head(stream).await?;
        self.touch(stream, &d);
        let close_only = append.body.is_empty() && append.close;
        if d.closed {
            let retry = append.producer.is_some() && append.producer == d.closed_by;
            return Ok(match (retry, &append.producer) {
                (true, Some(p)) => Appended::Duplicate {
                    last_seq: p.seq,
                    tail: d.tail,
                    closed: true,
                },
                // Closing a closed stream again, as nobody in particular:
                // it is closed, as asked.
                (false, None) if close_only => Appended::Done {
                    tail: d.tail,
                    closed: true,
                },
                _ => Appended::Closed { tail: d.tail },
            });
        }
        if !close_only {
            if append.body.is_empty() {
                return Err(Error::invalid(
                    "the body is empty: an append needs content (or Stream-Closed: true alone to close)",
                ));
            }
            let Some(given) = &append.content_type else {
                return Err(Error::invalid(
                    "Content-Type is missing: an append names its content type",
                ));
            };
            if durable::normalize_content_type(given)
                != durable::normalize_content_type(&d.content_type)
            {
                return Err(Error::conflict(
                    "content-type-mismatch",
                    format!(
                        "Content-Type {given:?} is not the stream's content type {:?}",
                        d.content_type
                    ),
                ));
            }
        }
        if let Some(p) = &append.producer {
            match d.check_producer(p) {
                ProducerCheck::Accept => {}
                ProducerCheck::Duplicate { last_seq } => {
                    return Ok(Appended::Duplicate {
                        last_seq,
                        tail: d.tail,
                        closed: d.closed,
                    });
                }
                ProducerCheck::StaleEpoch { current } => {
                    return Ok(Appended::StaleEpoch { current });
                }
                ProducerCheck::NewEpochNotAtZero => return Ok(Appended::NewEpochNotAtZero),
                ProducerCheck::Gap { expected, received } => {
                    return Ok(Appended::Gap { expected, received });
                }
            }
        }
        if let (Some(seq), Some(last)) = (&append.stream_seq, &d.stream_seq) {
            if seq <= last {
                return Err(Error::conflict(
                    "stream-seq-regression",
                    format!("Stream-Seq {seq:?} is not after the last one, {last:?}"),
                ));
            }
        }
        let provenance = Provenance {
            producer: append.producer.clone(),
            stream_seq: append.stream_seq.clone(),
        };
        let mut events = Vec::new();
        if close_only {
            // A close by a producer moves its sequence: a message-less
            // record of it would not, so the close carries it.
        } else if d.json_mode() {
            for m in durable::json_messages(&append.body, false)? {
                events.push(durable::json_message_event(m, &provenance));
            }
        } else {
            events.push(durable::bytes_message_event(&append.body, &provenance));
        }
        if append.close {
            events.push(durable::closed_event(append.producer.as_ref()));
        }
        self.durable_write(stream, events).await?;
        let after = self.durable_head(stream).await?;
        Ok(Appended::Done {
            tail: after.tail,
            closed: after.closed,
        })
    }

    /// `DELETE`: the protocol serves the stream no more (its events stay in
    /// the log, where subscriptions and processors already met them).
    pub async fn durable_delete(&self, stream: &StreamAddress) -> Result<(), Error> {
        let lock = self.durable.lock_of(stream);
        let _serial = lock.lock().await;
        self.durable_head(stream).await?;
        self.durable_write(stream, vec![durable::deleted_event()])
            .await?;
        self.durable
            .accessed
            .lock()
            .expect("durable access times")
            .remove(stream);
        Ok(())
    }

    async fn durable_write(
        &self,
        stream: &StreamAddress,
        events: Vec<EventInput>,
    ) -> Result<(), Error> {
        self.streams
            .append_here(stream, AppendInput::new(events), Authority::Platform)
            .await
            .map(|_| ())
    }

    /// `GET`: the events a reader sees after `from`, up to the stream's
    /// tail as it was when read (bounded: `up_to_date` says whether the
    /// page reached it).
    pub async fn durable_read(
        &self,
        stream: &StreamAddress,
        from: ReadFrom,
    ) -> Result<DurablePage, Error> {
        let d = self.durable_head(stream).await?;
        self.touch(stream, &d);
        let start = match from {
            ReadFrom::Start => d.created_offset,
            ReadFrom::Now => d.tail,
            ReadFrom::After(n) => n.max(d.created_offset),
        };
        let mut page = DurablePage {
            next: d.tail,
            up_to_date: true,
            events: Vec::new(),
            stream: d,
        };
        let tail = page.stream.tail;
        let mut after = start;
        let mut looked = 0;
        let mut bytes = 0;
        while after < tail {
            if looked >= READ_EVENTS_MAX || (bytes >= READ_BYTES_MAX && !page.events.is_empty()) {
                page.next = after;
                page.up_to_date = false;
                break;
            }
            let query = ReadQuery {
                after_offset: after,
                limit: crate::stream::READ_LIMIT_MAX,
                include_ephemeral: false,
            };
            let out = self.streams.read(stream, query).await?;
            if out.events.is_empty() {
                break;
            }
            for raw in &out.events {
                let event: Event = serde_json::from_str(raw.get())
                    .map_err(|e| Error::internal(format!("parsing a stored event: {e}")))?;
                if event.offset > tail {
                    break;
                }
                after = event.offset;
                looked += 1;
                if durable::is_visible(&event) {
                    bytes += raw.get().len();
                    page.events.push(event);
                }
            }
            if out.events.len() < crate::stream::READ_LIMIT_MAX {
                break;
            }
        }
        Ok(page)
    }

    /// A live connection that wakes a reader waiting after `after` (its
    /// batches are only a signal: the reader reads again).
    pub async fn durable_watch(
        &self,
        stream: &StreamAddress,
        after: u64,
    ) -> Result<LiveConnection, Error> {
        self.connect_here(stream, Connect::new().after(after).events_only())
            .await
    }

    /// Long-poll: a page of what comes after `after`, or `None` when
    /// nothing a reader sees arrived (and the stream was not closed)
    /// within `timeout`.
    pub async fn durable_wait(
        &self,
        stream: &StreamAddress,
        after: u64,
        timeout: Duration,
    ) -> Result<Option<DurablePage>, Error> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut live = self.durable_watch(stream, after).await?;
        loop {
            let page = self.durable_read(stream, ReadFrom::After(after)).await?;
            if !page.events.is_empty() || page.stream.closed {
                return Ok(Some(page));
            }
            if wait_for_news(&mut live, deadline).await != News::Committed {
                return Ok(None);
            }
        }
    }
}

/// What a reader waiting on a live connection heard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum News {
    /// An event was committed: read again.
    Committed,
    /// Nothing before the deadline.
    Timeout,
    /// The connection ended (the stream's actor let it go).
    Ended,
}

/// Waits until the live connection shows a committed event, ends, or
/// `deadline` passes.
pub(crate) async fn wait_for_news(
    live: &mut LiveConnection,
    deadline: tokio::time::Instant,
) -> News {
    loop {
        match tokio::time::timeout_at(deadline, live.next()).await {
            Err(_) => return News::Timeout,
            Ok(None) | Ok(Some(Live::Closed { .. })) => return News::Ended,
            Ok(Some(Live::Batch(batch))) => {
                let committed = batch
                    .parsed_events()
                    .map(|events| events.iter().any(|e| !e.ephemeral))
                    .unwrap_or(true);
                if committed {
                    return News::Committed;
                }
            }
        }
    }
}
