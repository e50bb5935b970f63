//! Listing a namespace's streams and resetting one (the other stream
//! operations are in the parent module). `GET .../streams` and
//! `{stream}:reset` over HTTP.

use serde::Serialize;

use super::request::{StreamAnswer, StreamRequest};
use super::Host;
use crate::error::Error;
use crate::stream::{CoreState, Namespace, StreamAddress};

/// Most streams in one page.
pub const LIST_LIMIT_MAX: usize = 1000;

/// Which streams of a namespace to list: a page in path order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamsQuery {
    /// Only paths starting with this (it starts with `/`).
    pub prefix: String,
    /// Only paths after this one (the previous page's `next_after_path`).
    pub after_path: Option<String>,
    /// At most this many (1 to [`LIST_LIMIT_MAX`]).
    pub limit: usize,
}

impl Default for StreamsQuery {
    fn default() -> Self {
        StreamsQuery {
            prefix: "/".into(),
            after_path: None,
            limit: 100,
        }
    }
}

impl StreamsQuery {
    /// The first 100 streams.
    pub fn new() -> Self {
        Self::default()
    }

    /// Only paths starting with `prefix`.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Only paths after `path`.
    pub fn after_path(mut self, path: impl Into<String>) -> Self {
        self.after_path = Some(path.into());
        self
    }

    /// At most `limit` streams.
    pub fn limit(mut self, limit: usize) -> Self {
        self.limit = limit;
        self
    }
}

/// A stream as the list shows it (from its stored row: listing starts no
/// actor).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StreamSummary {
    /// Its path.
    pub path: String,
    /// Its current lifetime.
    pub stream_id: String,
    /// When this lifetime began (RFC 3339).
    pub created_at: String,
    /// Its head offset.
    pub max_offset: u64,
    /// Committed events (`None` when its stored state is unreadable).
    pub event_count: Option<u64>,
    /// Whether it is paused.
    pub paused: bool,
    /// Its outbound subscriptions.
    pub subscriptions: usize,
}

/// A page of streams.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StreamsPage {
    /// The streams, in path order.
    pub streams: Vec<StreamSummary>,
    /// The last path when the page is full: the next page's
    /// [`StreamsQuery::after_path`].
    pub next_after_path: Option<String>,
}

impl Host {
    /// A page of the streams of `namespace`, in path order.
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> anyhow::Result<()> {
    /// # let dir = tempfile::tempdir()?;
    /// # let host = streamhost::Host::open(streamhost::Config { data_dir: dir.path().into(), ..Default::default() })?;
    /// use streamhost::{EventInput, Namespace, StreamsQuery};
    ///
    /// for path in ["/orders/eu", "/orders/us", "/users/1"] {
    ///     host.append(&host.stream("acme", path)?, [EventInput::new("events.example/x")]).await?;
    /// }
    /// let acme = Namespace::project("acme")?;
    /// let page = host.list_streams(&acme, StreamsQuery::new().prefix("/orders").limit(1)).await?;
    /// assert_eq!(page.streams[0].path, "/orders/eu");
    /// let next = StreamsQuery::new().prefix("/orders").after_path(page.next_after_path.unwrap());
    /// assert_eq!(host.list_streams(&acme, next).await?.streams[0].path, "/orders/us");
    /// # Ok(()) }
    /// ```
    pub async fn list_streams(
        &self,
        namespace: &Namespace,
        query: StreamsQuery,
    ) -> Result<StreamsPage, Error> {
        if !query.prefix.starts_with('/') {
            return Err(Error::invalid(format!(
                "prefix {:?} must start with \"/\"",
                query.prefix
            )));
        }
        if !(1..=LIST_LIMIT_MAX).contains(&query.limit) {
            return Err(Error::invalid(format!(
                "limit {} is out of range: it must be 1 to {LIST_LIMIT_MAX}",
                query.limit
            )));
        }
        let key = namespace.storage_key().to_string();
        let limit = query.limit;
        let rows = self
            .read_storage("listing streams", move |s| {
                s.list_streams(&key, &query.prefix, query.after_path.as_deref(), limit)
            })
            .await?;
        let next_after_path = (rows.len() == limit).then(|| rows[rows.len() - 1].path.clone());
        let streams = rows
            .into_iter()
            .map(|r| {
                let state: Option<CoreState> = serde_json::from_str(&r.state_json).ok();
                StreamSummary {
                    max_offset: state
                        .as_ref()
                        .map_or(r.head_offset, |s| s.max_offset.max(r.head_offset)),
                    event_count: state.as_ref().map(|s| s.event_count),
                    paused: state.as_ref().is_some_and(|s| s.paused),
                    subscriptions: state
                        .as_ref()
                        .map_or(0, |s| s.subscriptions.outbound.by_key.len()),
                    path: r.path,
                    stream_id: r.stream_id,
                    created_at: r.created_at,
                }
            })
            .collect();
        Ok(StreamsPage {
            streams,
            next_after_path,
        })
    }

    /// Wipes a stream; the next touch starts a new lifetime (an admin's
    /// operation over HTTP).
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> anyhow::Result<()> {
    /// # let dir = tempfile::tempdir()?;
    /// # let host = streamhost::Host::open(streamhost::Config { data_dir: dir.path().into(), ..Default::default() })?;
    /// use streamhost::EventInput;
    ///
    /// let orders = host.stream("acme", "/orders/eu")?;
    /// host.append(&orders, [EventInput::new("events.example/x")]).await?;
    /// let before = host.state(&orders).await?.stream_id;
    /// host.reset(&orders).await?;
    /// host.append(&orders, [EventInput::new("events.example/x")]).await?;
    /// assert_ne!(host.state(&orders).await?.stream_id, before); // a new lifetime
    /// # Ok(()) }
    /// ```
    pub async fn reset(&self, stream: &StreamAddress) -> Result<(), Error> {
        match self.apply(stream, StreamRequest::Reset).await? {
            StreamAnswer::Reset => Ok(()),
            other => Err(other.unexpected()),
        }
    }

    /// [`Host::reset`] on this host alone (see [`Host::apply`]).
    pub(crate) async fn reset_here(&self, stream: &StreamAddress) -> Result<(), Error> {
        self.streams.reset(stream).await
    }
}
