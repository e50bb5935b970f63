//! A guest call's stdout or stderr: every write is accepted (a guest that
//! logs a lot never traps for it), the first [`HEAD_BYTES`] and the last
//! [`TAIL_BYTES`] are kept, and the bytes between are counted. The head
//! holds the first lines (a wake's span shows them), the tail what the
//! guest wrote last (a panic's message, which a failure quotes).

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use tokio::io::AsyncWrite;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamError};

/// Bytes kept from the start of a call's output.
pub const HEAD_BYTES: usize = 64 * 1024;
/// Bytes kept from the end of a call's output, past the head.
pub const TAIL_BYTES: usize = 4096;

/// One call's stdout or stderr (clones share it).
#[derive(Debug, Clone, Default)]
pub struct OutputPipe {
    kept: Arc<Mutex<Kept>>,
}

#[derive(Debug, Default)]
struct Kept {
    head: Vec<u8>,
    tail: VecDeque<u8>,
    /// Bytes written between the head and the tail, not kept.
    skipped: u64,
}

impl OutputPipe {
    fn push(&self, bytes: &[u8]) {
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        let take = bytes.len().min(HEAD_BYTES - kept.head.len());
        kept.head.extend_from_slice(&bytes[..take]);
        let rest = &bytes[take..];
        if rest.is_empty() {
            return;
        }
        // Only the last TAIL_BYTES of `rest` can stay.
        let keep = &rest[rest.len().saturating_sub(TAIL_BYTES)..];
        let mut skipped = (rest.len() - keep.len()) as u64;
        kept.tail.extend(keep);
        let over = kept.tail.len().saturating_sub(TAIL_BYTES);
        kept.tail.drain(..over);
        skipped += over as u64;
        kept.skipped += skipped;
    }

    /// What was kept: the head, then (when bytes were left out) a line
    /// saying how many, then the tail.
    pub fn contents(&self) -> Vec<u8> {
        let kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = kept.head.clone();
        if kept.skipped > 0 {
            out.extend_from_slice(
                format!("\n… {} bytes of output left out …\n", kept.skipped).as_bytes(),
            );
        }
        out.extend(kept.tail.iter());
        out
    }
}

#[wasmtime_wasi::async_trait]
impl OutputStream for OutputPipe {
    fn write(&mut self, bytes: Bytes) -> Result<(), StreamError> {
        self.push(&bytes);
        Ok(())
    }

    fn flush(&mut self) -> Result<(), StreamError> {
        Ok(())
    }

    fn check_write(&mut self) -> Result<usize, StreamError> {
        Ok(HEAD_BYTES)
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for OutputPipe {
    async fn ready(&mut self) {}
}

impl AsyncWrite for OutputPipe {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.push(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

impl IsTerminal for OutputPipe {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for OutputPipe {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_output_is_kept_whole() {
        let p = OutputPipe::default();
        p.push(b"one\n");
        p.push(b"two\n");
        assert_eq!(p.contents(), b"one\ntwo\n");
    }

    #[test]
    fn long_output_keeps_its_head_and_tail_and_counts_the_rest() {
        let p = OutputPipe::default();
        p.push(&vec![b'a'; HEAD_BYTES - 1]);
        // One byte fills the head; 10,000 are skipped; the last 4,096 stay.
        p.push(&vec![b'b'; 1 + 10_000]);
        for _ in 0..TAIL_BYTES {
            p.push(b"c");
        }
        p.push(b"panicked");
        let out = p.contents();
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with(&"a".repeat(HEAD_BYTES - 1)));
        assert_eq!(text.as_bytes()[HEAD_BYTES - 1], b'b');
        let tail = format!("{}panicked", "c".repeat(TAIL_BYTES - 8));
        assert!(text.ends_with(&tail), "{}", &text[text.len() - 100..]);
        // 10,000 b's and 8 c's were pushed out of the tail.
        assert!(
            text.contains("\n… 10008 bytes of output left out …\n"),
            "{}",
            &text[HEAD_BYTES - 10..HEAD_BYTES + 60]
        );
        assert_eq!(
            text.len(),
            HEAD_BYTES + TAIL_BYTES + "\n… 10008 bytes of output left out …\n".len()
        );
    }
}
