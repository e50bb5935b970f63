//! The feed of one live connection: its replay (stored events after the
//! cursor, merged with buffered ephemeral ones, up to the head at
//! registration), then the live events the stream's actor sends after each
//! commit. Consumers (the SSE endpoint, waitForEvent) filter and render.

use std::collections::VecDeque;
use std::sync::Arc;

use serde_json::Value;
use tokio::sync::mpsc;

use super::{CloseReason, LiveEvent};
use crate::storage::Storage;

/// Stored events read per replay page.
const REPLAY_PAGE_EVENTS: usize = 500;

/// What the actor sends a connection.
#[derive(Debug, Clone)]
pub enum ConnMsg {
    /// The events of one commit (unfiltered), the state after it when the
    /// connection wants state, and the head.
    Events {
        events: Arc<Vec<LiveEvent>>,
        state: Option<Arc<str>>,
        stream_max_offset: u64,
    },
    /// The actor closed the connection.
    Close {
        reason: CloseReason,
        error: Option<String>,
    },
}

/// What a consumer reads next.
#[derive(Debug, Clone)]
pub enum FeedItem {
    Events {
        events: Arc<Vec<LiveEvent>>,
        state: Option<Arc<str>>,
        stream_max_offset: u64,
        /// True for the first item, which is sent even when empty.
        first: bool,
    },
    Closed {
        reason: CloseReason,
        error: Option<String>,
    },
}

/// Tells the actor that a connection ended from the consumer's side.
pub type EndNotice = Box<dyn FnOnce(CloseReason, Option<String>) + Send>;

/// Sends its notice when dropped, unless the actor ended the connection.
pub struct Guard {
    notice: Option<EndNotice>,
}

impl Guard {
    pub fn new(notice: EndNotice) -> Guard {
        Guard {
            notice: Some(notice),
        }
    }

    /// Ends the connection with a reason (consumer side).
    pub fn end(&mut self, reason: CloseReason, error: Option<String>) {
        if let Some(n) = self.notice.take() {
            n(reason, error);
        }
    }

    /// The actor already ended it: nothing to tell.
    pub fn disarm(&mut self) {
        self.notice = None;
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.end(CloseReason::ClosedByOwner, None);
    }
}

/// Replay coordinates handed over at registration.
pub struct Replay {
    pub storage: Storage,
    pub row_id: i64,
    pub after: u64,
    pub head: u64,
    /// Buffered ephemeral events in `(after, head]`, in order.
    pub ephemeral: Vec<LiveEvent>,
}

/// One registered connection, as its consumer sees it.
pub struct Feed {
    replay: Option<Replay>,
    initial_state: Option<Arc<str>>,
    head: u64,
    first: bool,
    rx: mpsc::Receiver<ConnMsg>,
    pub guard: Guard,
    /// Its place in its project's count of live connections.
    pub slot: Option<crate::quota::LiveSlot>,
}

impl Feed {
    pub fn new(
        replay: Option<Replay>,
        initial_state: Option<Arc<str>>,
        head: u64,
        rx: mpsc::Receiver<ConnMsg>,
        guard: Guard,
    ) -> Feed {
        Feed {
            replay,
            initial_state,
            head,
            first: true,
            rx,
            guard,
            slot: None,
        }
    }

    /// Whether live items are already queued (a consumer may coalesce).
    pub fn pending(&self) -> bool {
        !self.rx.is_empty()
    }

    /// The next item; `None` when the actor dropped the connection.
    pub async fn next(&mut self) -> Option<FeedItem> {
        if let Some(replay) = &mut self.replay {
            match next_replay_page(replay).await {
                Ok(Some(events)) => {
                    let first = std::mem::replace(&mut self.first, false);
                    return Some(FeedItem::Events {
                        events: Arc::new(events),
                        state: self.initial_state.clone(),
                        stream_max_offset: self.head,
                        first,
                    });
                }
                Ok(None) => self.replay = None,
                Err(e) => {
                    self.replay = None;
                    return Some(FeedItem::Closed {
                        reason: CloseReason::DeliveryFailed,
                        error: Some(format!("replay failed: {e}")),
                    });
                }
            }
        }
        if self.first {
            self.first = false;
            return Some(FeedItem::Events {
                events: Arc::new(Vec::new()),
                state: self.initial_state.clone(),
                stream_max_offset: self.head,
                first: true,
            });
        }
        match self.rx.recv().await? {
            ConnMsg::Events {
                events,
                state,
                stream_max_offset,
            } => Some(FeedItem::Events {
                events,
                state,
                stream_max_offset,
                first: false,
            }),
            ConnMsg::Close { reason, error } => {
                self.guard.disarm();
                Some(FeedItem::Closed { reason, error })
            }
        }
    }
}

/// Reads the next replay page, merged with ephemeral events; `None` when the
/// replay reached the registration head.
async fn next_replay_page(r: &mut Replay) -> anyhow::Result<Option<Vec<LiveEvent>>> {
    if r.after >= r.head {
        return Ok(None);
    }
    let (storage, row_id, after, head) = (r.storage.clone(), r.row_id, r.after, r.head);
    let page = tokio::task::spawn_blocking(move || {
        storage.events_after(row_id, after, REPLAY_PAGE_EVENTS, head)
    })
    .await??;
    // A page cut short by its count or its bytes ends at its last event
    // (one that just reached the byte bound counts as cut: the next page
    // then simply starts after it).
    let bytes: usize = page.iter().map(|(_, body)| body.len()).sum();
    let full = page.len() == REPLAY_PAGE_EVENTS || bytes >= r.storage.bounds().read_bytes_max;
    let through = if full {
        page.last().map(|(o, _)| *o).unwrap_or(head)
    } else {
        head
    };
    let mut ephemeral: VecDeque<LiveEvent> = r
        .ephemeral
        .iter()
        .filter(|e| e.offset > after && e.offset <= through)
        .cloned()
        .collect();
    let mut out = Vec::with_capacity(page.len() + ephemeral.len());
    for (offset, body) in page {
        while ephemeral.front().is_some_and(|e| e.offset < offset) {
            out.push(ephemeral.pop_front().expect("front"));
        }
        let value: Value = serde_json::from_str(&body)?;
        let event_type = value["type"].as_str().unwrap_or_default().to_string();
        out.push(LiveEvent {
            offset,
            event_type,
            json: body.into(),
            value: Arc::new(value),
        });
    }
    out.extend(ephemeral);
    r.after = through;
    Ok(Some(out))
}
