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

use bytes::Bytes;

use super::live::{Connect, Live, LiveConnection};
use super::Host;
use crate::error::{Error, ErrorKind};
use crate::stream::durable::{
    self, Created, DurableStream, ProducerCheck, ProducerRefusal, ProducerStamp, Provenance,
    ReadFrom,
};
use crate::stream::{AppendInput, Authority, Event, EventInput, ReadQuery, StreamAddress};
use serde_json::Value;

use super::request::{StreamAnswer, StreamRequest};

/// The most events a read looks at before it answers (the protocol lets
/// a server bound its chunks; `Stream-Up-To-Date` is then left off).
const READ_EVENTS_MAX: usize = 2000;
/// The most bytes a read answers, past its first event.
const READ_BYTES_MAX: usize = 4 * 1024 * 1024;
/// How often an append is looked at again when other writers keep
/// getting in between its check and its commit.
const APPEND_ATTEMPTS: u32 = 16;

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

/// `PUT`: a stream's configuration as asked (what is not given a fork
/// inherits from its source), whether it is created closed, and its first
/// content.
#[derive(Debug, Clone, Default)]
pub struct DurableCreate {
    /// `Content-Type`, if given.
    pub content_type: Option<String>,
    /// `Stream-TTL`.
    pub ttl_seconds: Option<u64>,
    /// `Stream-Expires-At`.
    pub expires_at: Option<String>,
    /// `Stream-Closed: true`.
    pub closed: bool,
    /// The initial bytes (may be empty).
    pub body: Bytes,
    /// `Stream-Forked-From` and its offsets.
    pub fork: Option<ForkRequest>,
}

/// A fork asked for: `Stream-Forked-From`, `Stream-Fork-Offset`,
/// `Stream-Fork-Sub-Offset`.
#[derive(Debug, Clone)]
pub struct ForkRequest {
    /// The source stream (same project).
    pub source: StreamAddress,
    /// The fork offset (default: the source's tail).
    pub offset: Option<u64>,
    /// How much of the source's next message to take (bytes, or JSON
    /// messages of its batch).
    pub sub_offset: u64,
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
    /// The producer's request is refused: a zombie's epoch (`403`), a new
    /// epoch not at sequence 0 (`400`), a gap in its sequence (`409`).
    Refused(ProducerRefusal),
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
        self.stream.closed && self.up_to_date && self.next >= self.stream.shown_tail()
    }
}

fn not_found(stream: &StreamAddress) -> Error {
    Error::not_found(
        "stream-not-found",
        format!("no Durable Streams stream at {:?}", stream.path),
    )
}

fn gone(stream: &StreamAddress) -> Error {
    Error::new(
        ErrorKind::Gone,
        "stream-gone",
        format!(
            "stream {:?} was deleted (or expired); its forks still read what they inherited from it",
            stream.path
        ),
    )
}

/// A stream as the protocol finds it.
enum Found {
    /// Never created through the protocol, deleted, or expired.
    Missing,
    /// Deleted or expired while forks read from it: `410` to its own
    /// readers, still read through its forks.
    Gone(DurableStream),
    /// Served.
    Live(DurableStream),
}

impl Found {
    /// The stream, if its own readers may use it.
    fn live(self, stream: &StreamAddress) -> Result<DurableStream, Error> {
        match self {
            Found::Live(d) => Ok(d),
            Found::Gone(_) => Err(gone(stream)),
            Found::Missing => Err(not_found(stream)),
        }
    }
}

impl Host {
    /// How the protocol finds `stream`: on this host's own actor (`here`:
    /// the stream the request names, which the HTTP layer brought to its
    /// owner) or wherever it is owned (a fork's source).
    async fn durable_lookup(&self, stream: &StreamAddress, here: bool) -> Result<Found, Error> {
        let state = if here {
            self.state_here(stream).await
        } else {
            self.state(stream).await
        };
        let state = match state {
            Ok(s) => s,
            Err(e) if e.kind == ErrorKind::NotFound && e.code == "stream-not-found" => {
                return Ok(Found::Missing);
            }
            Err(e) => return Err(e),
        };
        let Some(d) = state.durable_stream else {
            return Ok(Found::Missing);
        };
        if d.deleted {
            return Ok(Found::Gone(d));
        }
        if self.expired(stream, &d) {
            return Ok(if d.forks.is_empty() {
                Found::Missing
            } else {
                Found::Gone(d)
            });
        }
        Ok(Found::Live(d))
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
        self.durable_lookup(stream, true).await?.live(stream)
    }

    /// `PUT`: creates the stream (`true`) or finds it created with the same
    /// configuration (`false`); another configuration is `409`. A fork
    /// reads its source's events up to the fork offset, then its own.
    pub async fn durable_create(
        &self,
        stream: &StreamAddress,
        create: DurableCreate,
    ) -> Result<(bool, DurableStream), Error> {
        let lock = self.durable.lock_of(stream);
        let _serial = lock.lock().await;
        match self.durable_lookup(stream, true).await? {
            Found::Gone(_) => {
                return Err(Error::conflict(
                    "stream-gone",
                    format!(
                        "stream {:?} was deleted while forks still read from it: its path is \
                         taken until they are deleted",
                        stream.path
                    ),
                ));
            }
            Found::Live(existing) => {
                if same_configuration(&create, &existing) {
                    self.touch(stream, &existing);
                    return Ok((false, existing));
                }
                return Err(Error::conflict(
                    "stream-exists",
                    format!(
                        "a stream exists at {:?} with another configuration (content type {:?}, \
                         TTL {:?}, expiry {:?}, closed {}, forked from {:?})",
                        stream.path,
                        existing.content_type,
                        existing.ttl_seconds,
                        existing.expires_at,
                        existing.closed,
                        existing.forked_from.as_ref().map(|f| &f.path)
                    ),
                ));
            }
            Found::Missing => {}
        }
        let (config, prefix) = match &create.fork {
            None => (
                Created {
                    content_type: create
                        .content_type
                        .clone()
                        .unwrap_or_else(|| "application/octet-stream".into()),
                    ttl_seconds: create.ttl_seconds,
                    expires_at: create.expires_at.clone(),
                    forked_from: None,
                },
                Vec::new(),
            ),
            Some(fork) => self.resolve_fork(&create, fork).await?,
        };
        let json = durable::is_json(&config.content_type);
        let mut events = vec![config.event()];
        events.extend(prefix);
        let none = Provenance::default();
        if json {
            if !create.body.is_empty() {
                let messages = durable::json_messages(&create.body, true)?;
                events.extend(durable::json_batch_events(messages, &none));
            }
        } else if !create.body.is_empty() {
            events.push(durable::bytes_message_event(&create.body, &none));
        }
        if create.closed {
            events.push(durable::closed_event(None));
        }
        if let Some(fork) = &create.fork {
            // The source counts its forks first: a fork is never read
            // while its source could be collected.
            self.durable_fork_counted(&fork.source, &stream.path, true)
                .await?;
            if let Err(e) = self.durable_write(stream, events).await {
                let _ = self
                    .durable_fork_counted(&fork.source, &stream.path, false)
                    .await;
                return Err(e);
            }
        } else {
            self.durable_write(stream, events).await?;
        }
        let created = self.durable_head(stream).await?;
        self.touch(stream, &created);
        Ok((true, created))
    }

    /// A fork's configuration from its source, and the events of the part
    /// of the source's next message it takes (its sub-offset).
    async fn resolve_fork(
        &self,
        create: &DurableCreate,
        fork: &ForkRequest,
    ) -> Result<(Created, Vec<EventInput>), Error> {
        let source = match self.durable_lookup(&fork.source, false).await? {
            Found::Live(d) => d,
            Found::Gone(_) => {
                return Err(Error::conflict(
                    "stream-gone",
                    format!(
                        "the source stream {:?} was deleted: it cannot be forked",
                        fork.source.path
                    ),
                ));
            }
            Found::Missing => {
                return Err(Error::not_found(
                    "stream-not-found",
                    format!("no source stream at {:?} to fork", fork.source.path),
                ));
            }
        };
        if let Some(given) = &create.content_type {
            if durable::normalize_content_type(given)
                != durable::normalize_content_type(&source.content_type)
            {
                return Err(Error::conflict(
                    "content-type-mismatch",
                    format!(
                        "Content-Type {given:?} is not the source stream's content type {:?}",
                        source.content_type
                    ),
                ));
            }
        }
        let tail = source.shown_tail();
        let offset = fork.offset.unwrap_or(tail);
        if offset > tail {
            return Err(Error::invalid(format!(
                "Stream-Fork-Offset {} is beyond the source stream's tail {}",
                durable::format_offset(offset),
                durable::format_offset(tail)
            )));
        }
        let mut prefix = Vec::new();
        if fork.sub_offset > 0 {
            let page = self
                .durable_page(&fork.source, &source, ReadFrom::After(offset), None, false)
                .await?;
            let Some(next) = page.events.first() else {
                return Err(Error::invalid(format!(
                    "Stream-Fork-Sub-Offset {} names part of the message after offset {}, and \
                     there is none",
                    fork.sub_offset,
                    durable::format_offset(offset)
                )));
            };
            let none = Provenance::default();
            if source.json_mode() {
                let available = durable::rest_of_batch(next);
                if fork.sub_offset > available {
                    return Err(Error::invalid(format!(
                        "Stream-Fork-Sub-Offset {} is more than the {available} messages of the \
                         append after offset {}",
                        fork.sub_offset,
                        durable::format_offset(offset)
                    )));
                }
                let messages: Vec<Value> = page
                    .events
                    .iter()
                    .take(fork.sub_offset as usize)
                    .map(durable::as_json_message)
                    .collect();
                prefix = durable::json_batch_events(messages, &none);
            } else {
                let bytes = durable::as_bytes(next);
                if fork.sub_offset > bytes.len() as u64 {
                    return Err(Error::invalid(format!(
                        "Stream-Fork-Sub-Offset {} is more than the {} bytes of the message \
                         after offset {}",
                        fork.sub_offset,
                        bytes.len(),
                        durable::format_offset(offset)
                    )));
                }
                prefix.push(durable::bytes_message_event(
                    &bytes[..fork.sub_offset as usize],
                    &none,
                ));
            }
        }
        // A lifetime not given is the source's.
        let inherit = create.ttl_seconds.is_none() && create.expires_at.is_none();
        let config = Created {
            content_type: create
                .content_type
                .clone()
                .unwrap_or_else(|| source.content_type.clone()),
            ttl_seconds: if inherit {
                source.ttl_seconds
            } else {
                create.ttl_seconds
            },
            expires_at: if inherit {
                source.expires_at.clone()
            } else {
                create.expires_at.clone()
            },
            forked_from: Some(durable::ForkOrigin {
                path: fork.source.path.clone(),
                offset,
                sub_offset: fork.sub_offset,
            }),
        };
        Ok((config, prefix))
    }

    /// Records on `source` that the fork at `fork_path` exists (`true`) or
    /// is gone; a source deleted meanwhile whose last fork this was is
    /// deleted for good, and so on up its own sources.
    async fn durable_fork_counted(
        &self,
        source: &StreamAddress,
        fork_path: &str,
        exists: bool,
    ) -> Result<(), Error> {
        let lock = self.durable.lock_of(source);
        let _serial = lock.lock().await;
        self.streams
            .append(
                source,
                AppendInput::new([durable::fork_event(fork_path, !exists)]),
                Authority::Platform,
            )
            .await?;
        if exists {
            return Ok(());
        }
        let Found::Gone(d) = self.durable_lookup(source, false).await? else {
            return Ok(());
        };
        if !d.forks.is_empty() {
            return Ok(());
        }
        self.streams
            .append(
                source,
                AppendInput::new([durable::deleted_event(false)]),
                Authority::Platform,
            )
            .await?;
        if let Some(origin) = &d.forked_from {
            let up = StreamAddress::new(source.namespace.clone(), &origin.path)?;
            Box::pin(self.durable_fork_counted(&up, &source.path, false)).await?;
        }
        Ok(())
    }

    /// `POST`: appends (or closes), a producer's request checked against
    /// the producer's state. No lock: the append's planning checks again
    /// what was checked here (open, the producer's next request, a rising
    /// `Stream-Seq`) as it commits, so concurrent appends to one stream
    /// share group commits; when another writer got in between, the
    /// request is looked at again.
    pub async fn durable_append(
        &self,
        stream: &StreamAddress,
        append: DurableAppend,
    ) -> Result<Appended, Error> {
        let mut attempts = 0;
        loop {
            attempts += 1;
            match self.durable_append_once(stream, &append).await {
                Err(e)
                    if attempts < APPEND_ATTEMPTS
                        && e.kind == ErrorKind::Conflict
                        && matches!(e.code, "stream-closed" | "producer-state-moved") =>
                {
                    continue;
                }
                other => return other,
            }
        }
    }

    async fn durable_append_once(
        &self,
        stream: &StreamAddress,
        append: &DurableAppend,
    ) -> Result<Appended, Error> {
        let d = self.durable_head(stream).await?;
        self.touch(stream, &d);
        let close_only = append.body.is_empty() && append.close;
        if d.closed {
            let retry = append.producer.is_some() && append.producer == d.closed_by;
            return Ok(match (retry, &append.producer) {
                (true, Some(p)) => Appended::Duplicate {
                    last_seq: p.seq,
                    tail: d.shown_tail(),
                    closed: true,
                },
                // Closing a closed stream again, as nobody in particular:
                // it is closed, as asked.
                (false, None) if close_only => Appended::Done {
                    tail: d.shown_tail(),
                    closed: true,
                },
                _ => Appended::Closed {
                    tail: d.shown_tail(),
                },
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
                        tail: d.shown_tail(),
                        closed: d.closed,
                    });
                }
                ProducerCheck::Refused(why) => return Ok(Appended::Refused(why)),
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
            // Only the close (it records a producer's request: its retry
            // is then a duplicate, and the producer's sequence moves).
        } else if d.json_mode() {
            let messages = durable::json_messages(&append.body, false)?;
            events.extend(durable::json_batch_events(messages, &provenance));
        } else {
            events.push(durable::bytes_message_event(&append.body, &provenance));
        }
        if append.close {
            events.push(durable::closed_event(append.producer.as_ref()));
        }
        let out = self
            .streams
            .append_here(stream, AppendInput::new(events), Authority::Platform)
            .await?;
        let last = out
            .events
            .iter()
            .rev()
            .find(|e| durable::is_visible(e))
            .map(|e| d.shown(e.offset));
        let tail = match last {
            Some(t) => t,
            // Only a close: the tail is what it was when it closed.
            None => self.durable_head(stream).await?.shown_tail(),
        };
        Ok(Appended::Done {
            tail,
            closed: append.close,
        })
    }

    /// `DELETE`: the protocol serves the stream no more (its events stay in
    /// the log, where subscriptions and processors already met them). One
    /// that forks still read from is gone for its own readers only, until
    /// its last fork is deleted.
    pub async fn durable_delete(&self, stream: &StreamAddress) -> Result<(), Error> {
        let lock = self.durable.lock_of(stream);
        let _serial = lock.lock().await;
        let d = self.durable_lookup(stream, true).await?.live(stream)?;
        let soft = !d.forks.is_empty();
        self.durable_write(stream, vec![durable::deleted_event(soft)])
            .await?;
        self.durable
            .accessed
            .lock()
            .expect("durable access times")
            .remove(stream);
        drop(_serial);
        if !soft {
            if let Some(origin) = &d.forked_from {
                let source = StreamAddress::new(stream.namespace.clone(), &origin.path)?;
                self.durable_fork_counted(&source, &stream.path, false)
                    .await?;
            }
        }
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
        self.durable_page(stream, &d, from, None, true).await
    }

    /// A page of `stream` (state `d`) after `from` up to its tail, or to
    /// `cap` (a fork reading what it inherited); `here`: on this host's
    /// own actor.
    async fn durable_page(
        &self,
        stream: &StreamAddress,
        d: &DurableStream,
        from: ReadFrom,
        cap: Option<u64>,
        here: bool,
    ) -> Result<DurablePage, Error> {
        let tail = d.shown_tail();
        let limit = cap.map_or(tail, |c| c.min(tail));
        let after = match from {
            ReadFrom::Start => None,
            ReadFrom::Now => Some(tail),
            ReadFrom::After(n) => Some(n),
        };
        let mut page = DurablePage {
            stream: d.clone(),
            events: Vec::new(),
            next: limit,
            up_to_date: true,
        };
        // What it inherited, read from its source (and so on up).
        if let Some(origin) = &d.forked_from {
            if after.is_none_or(|o| o < origin.offset) {
                let source = StreamAddress::new(stream.namespace.clone(), &origin.path)?;
                let inherited = match self.durable_lookup(&source, false).await? {
                    Found::Live(s) | Found::Gone(s) => {
                        let cap = origin.offset.min(limit);
                        Box::pin(self.durable_page(&source, &s, from, Some(cap), false)).await?
                    }
                    Found::Missing => {
                        return Err(Error::internal(format!(
                            "the source {:?} of fork {:?} is gone",
                            origin.path, stream.path
                        )));
                    }
                };
                page.events = inherited.events;
                if !inherited.up_to_date {
                    page.next = inherited.next;
                    page.up_to_date = false;
                    return Ok(page);
                }
            }
        }
        // Its own events.
        let base = d.base();
        let mut own_after = after
            .unwrap_or(0)
            .saturating_sub(base)
            .max(d.created_offset);
        let own_limit = limit.saturating_sub(base);
        let mut looked = 0;
        let mut bytes = 0;
        while own_after < own_limit {
            if looked >= READ_EVENTS_MAX || (bytes >= READ_BYTES_MAX && !page.events.is_empty()) {
                page.next = d.shown(own_after);
                page.up_to_date = false;
                break;
            }
            let query = ReadQuery {
                after_offset: own_after,
                limit: crate::stream::READ_LIMIT_MAX,
                include_ephemeral: false,
            };
            let out = if here {
                self.streams.read(stream, query).await?
            } else {
                match self.apply(stream, StreamRequest::Events(query)).await? {
                    StreamAnswer::Events(out) => out,
                    other => return Err(other.unexpected()),
                }
            };
            if out.events.is_empty() {
                break;
            }
            let full = out.events.len() == crate::stream::READ_LIMIT_MAX;
            for raw in &out.events {
                let event: Event = serde_json::from_str(raw.get())
                    .map_err(|e| Error::internal(format!("parsing a stored event: {e}")))?;
                if event.offset > own_limit {
                    own_after = own_limit;
                    break;
                }
                own_after = event.offset;
                looked += 1;
                if durable::is_visible(&event) {
                    bytes += raw.get().len();
                    page.events.push(event);
                }
            }
            if !full {
                break;
            }
        }
        Ok(page)
    }

    /// A live connection that wakes a reader of `stream` (state `d`)
    /// waiting after `after` (its batches are only a signal: the reader
    /// reads again).
    pub async fn durable_watch(
        &self,
        stream: &StreamAddress,
        d: &DurableStream,
        after: u64,
    ) -> Result<LiveConnection, Error> {
        let own = after.saturating_sub(d.base()).max(d.created_offset);
        self.connect_here(stream, Connect::new().after(own).events_only())
            .await
    }

    /// Long-poll: a page of what comes after `after`, or `None` when
    /// nothing a reader sees arrived (and the stream was not closed)
    /// within `timeout`. What arrives is taken from the live connection
    /// itself: a thousand waiting readers read nothing again.
    pub async fn durable_wait(
        &self,
        stream: &StreamAddress,
        d: &DurableStream,
        after: u64,
        timeout: Duration,
    ) -> Result<Option<DurablePage>, Error> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut live = self.durable_watch(stream, d, after).await?;
        let mut stream_state = d.clone();
        loop {
            match next_arrival(&mut live, deadline).await {
                Ok(a) => {
                    if a.deleted {
                        return Err(not_found(stream));
                    }
                    stream_state.closed |= a.closed;
                    if a.events.is_empty() && !a.closed {
                        continue;
                    }
                    let next = a
                        .events
                        .last()
                        .map_or(after.max(d.shown_tail()), |e| d.shown(e.offset));
                    return Ok(Some(DurablePage {
                        stream: stream_state,
                        events: a.events,
                        next,
                        up_to_date: a.complete,
                    }));
                }
                Err(_) => return Ok(None),
            }
        }
    }
}

/// What one live batch brought a reader.
#[derive(Debug, Clone, Default)]
pub struct Arrival {
    /// The events a reader sees.
    pub events: Vec<Event>,
    /// The stream was closed.
    pub closed: bool,
    /// The stream was deleted.
    pub deleted: bool,
    /// The batch reached the stream's head when it was sent.
    pub complete: bool,
}

/// The next batch of committed events on a reader's live connection, or
/// why there is none: the deadline passed, or the connection ended.
pub(crate) async fn next_arrival(
    live: &mut LiveConnection,
    deadline: tokio::time::Instant,
) -> Result<Arrival, News> {
    loop {
        let batch = match tokio::time::timeout_at(deadline, live.next()).await {
            Err(_) => return Err(News::Timeout),
            Ok(None) | Ok(Some(Live::Closed { .. })) => return Err(News::Ended),
            Ok(Some(Live::Batch(batch))) => batch,
        };
        let Ok(events) = batch.parsed_events() else {
            return Err(News::Ended);
        };
        let committed: Vec<Event> = events.into_iter().filter(|e| !e.ephemeral).collect();
        let Some(last) = committed.last().map(|e| e.offset) else {
            continue;
        };
        let mut arrival = Arrival {
            complete: last >= batch.stream_max_offset,
            ..Arrival::default()
        };
        for e in committed {
            if !e.is_copy() {
                match e.event_type.as_str() {
                    crate::stream::types::DURABLE_STREAM_CLOSED => arrival.closed = true,
                    crate::stream::types::DURABLE_STREAM_DELETED => arrival.deleted = true,
                    _ => {}
                }
            }
            if durable::is_visible(&e) && !arrival.closed && !arrival.deleted {
                arrival.events.push(e);
            }
        }
        return Ok(arrival);
    }
}

/// Whether a `PUT` asks for the configuration `existing` was created with
/// (what a fork's `PUT` leaves out, it inherited: not compared).
fn same_configuration(create: &DurableCreate, existing: &DurableStream) -> bool {
    let content_type = match (&create.content_type, &create.fork) {
        (Some(t), _) => durable::normalize_content_type(t),
        (None, Some(_)) => durable::normalize_content_type(&existing.content_type),
        (None, None) => "application/octet-stream".into(),
    };
    let lifetime_given = create.ttl_seconds.is_some() || create.expires_at.is_some();
    let lifetime = !(create.fork.is_none() || lifetime_given)
        || (create.ttl_seconds == existing.ttl_seconds && create.expires_at == existing.expires_at);
    let fork = match (&create.fork, &existing.forked_from) {
        (None, None) => true,
        (Some(f), Some(o)) => {
            f.source.path == o.path
                && f.sub_offset == o.sub_offset
                && f.offset.is_none_or(|x| x == o.offset)
        }
        _ => false,
    };
    content_type == durable::normalize_content_type(&existing.content_type)
        && lifetime
        && fork
        && create.closed == existing.closed
}

/// Why a reader waiting on a live connection heard nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum News {
    /// Nothing before the deadline.
    Timeout,
    /// The connection ended (the stream's actor let it go).
    Ended,
}
