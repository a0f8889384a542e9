//! Guest stdout/stderr and `log` lines into the host log, capped so a chatty plugin cannot
//! flood it.

use std::collections::VecDeque;
use std::io;
use std::pin::Pin;
use std::sync::Arc;

use parking_lot::Mutex;
use std::task::{Context, Poll};

use tokio::io::AsyncWrite;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};

/// Who is speaking, carried on every line the plugin produces.
#[derive(Debug, Clone)]
pub(crate) struct Origin {
    pub pool: Arc<str>,
    pub plugin: Arc<str>,
}

#[derive(Debug)]
struct Sink {
    origin: Origin,
    stream: &'static str,
    line: Vec<u8>,
    budget: usize,
    dropped: u64,
    /// The last lines, escaped, for a fault report.
    tail: VecDeque<String>,
}

const MAX_LINE: usize = 4096;
/// Lines of guest output a fault report shows, and their longest.
const TAIL_LINES: usize = 12;
const TAIL_LINE: usize = 300;

impl Sink {
    fn emit(&mut self) {
        if self.line.is_empty() {
            return;
        }
        let text = String::from_utf8_lossy(&self.line);
        // A stray `\r` (or any control character) must not forge or hide host log lines.
        let text = guest_text(text.trim_end(), MAX_LINE);
        if self.tail.len() == TAIL_LINES {
            self.tail.pop_front();
        }
        self.tail.push_back(guest_text(&text, TAIL_LINE));
        tracing::info!(
            target: "flotilla::plugin::output",
            pool = %self.origin.pool,
            plugin = %self.origin.plugin,
            stream = self.stream,
            "{text}"
        );
        self.line.clear();
    }

    fn write(&mut self, buf: &[u8]) {
        for &b in buf {
            if self.budget == 0 {
                if self.dropped == 0 {
                    self.emit();
                    tracing::warn!(
                        target: "flotilla::plugin::output",
                        pool = %self.origin.pool,
                        plugin = %self.origin.plugin,
                        stream = self.stream,
                        "plugin output cap reached; the rest of this instance's {} is dropped",
                        self.stream
                    );
                }
                self.dropped += 1;
                continue;
            }
            self.budget -= 1;
            if b == b'\n' {
                self.emit();
            } else if self.line.len() < MAX_LINE {
                self.line.push(b);
            }
        }
    }
}

/// A capped stdout or stderr for one plugin instance.
#[derive(Debug, Clone)]
pub(crate) struct GuestOutput(Arc<Mutex<Sink>>);

impl GuestOutput {
    pub(crate) fn new(origin: Origin, stream: &'static str, budget: usize) -> Self {
        GuestOutput(Arc::new(Mutex::new(Sink {
            origin,
            stream,
            line: Vec::new(),
            budget,
            dropped: 0,
            tail: VecDeque::new(),
        })))
    }

    /// The last lines written (escaped and shortened), the unfinished one included: what a
    /// fault report shows of the guest's own words, e.g. a Python traceback or a panic.
    pub(crate) fn tail(&self) -> Vec<String> {
        let sink = self.0.lock();
        let mut lines: Vec<String> = sink.tail.iter().cloned().collect();
        if !sink.line.is_empty() {
            let text = String::from_utf8_lossy(&sink.line);
            lines.push(guest_text(text.trim_end(), TAIL_LINE));
        }
        let skip = lines.len().saturating_sub(TAIL_LINES);
        lines.split_off(skip)
    }

    /// Logs a trailing partial line (called when the instance goes away).
    pub(crate) fn flush_line(&self) {
        {
            let mut sink = self.0.lock();
            sink.emit();
        }
    }
}

impl IsTerminal for GuestOutput {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for GuestOutput {
    fn async_stream(&self) -> Box<dyn AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

impl AsyncWrite for GuestOutput {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        {
            let mut sink = self.0.lock();
            sink.write(buf);
        }
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// A guest's text made safe to log and serve: capped, control characters escaped.
pub(crate) fn guest_text(m: &str, cap: usize) -> String {
    let mut out = String::with_capacity(m.len().min(cap) + 16);
    for (n, c) in m.chars().enumerate() {
        if n >= cap {
            out.push_str(&format!("… ({} bytes in all)", m.len()));
            break;
        }
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}
