//! What one pool's plugin may hold open: requests in flight, requests per minute, and no
//! request outliving the export call that made it.
//!
//! A request takes a permit from the pool's budget when it is admitted and gives it back when
//! its response body ends, is dropped, or the call that made it returns, whichever comes
//! first. Ending the call also drops the response body, and with it the connection, so a guest
//! that keeps response handles in its state cannot hold sockets (file descriptors) between
//! calls.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::BodyExt;
use parking_lot::Mutex;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use wasmtime_wasi_http::{Error as HttpError, WasiBody};

const MINUTE: Duration = Duration::from_secs(60);

/// The request budget shared by all instances of one pool's plugin.
#[derive(Debug)]
pub struct Budget {
    in_flight: Arc<Semaphore>,
    max_in_flight: u32,
    per_minute: u32,
    /// When each request of the last minute was admitted (at most `per_minute` entries).
    recent: Mutex<VecDeque<Instant>>,
}

impl Default for Budget {
    fn default() -> Self {
        let limits = crate::limits::Limits::default();
        Budget::new(limits.requests_in_flight, limits.requests_per_minute)
    }
}

impl Budget {
    /// A budget of `max_in_flight` concurrent requests and `per_minute` requests a minute.
    pub fn new(max_in_flight: u32, per_minute: u32) -> Budget {
        Budget {
            in_flight: Arc::new(Semaphore::new(max_in_flight as usize)),
            max_in_flight,
            per_minute,
            recent: Mutex::new(VecDeque::new()),
        }
    }

    /// Admits one request, or says which budget it exceeds.
    pub(super) fn admit(&self) -> Result<OwnedSemaphorePermit, String> {
        let now = Instant::now();
        let mut recent = self.recent.lock();
        while recent
            .front()
            .is_some_and(|t| now.duration_since(*t) >= MINUTE)
        {
            recent.pop_front();
        }
        if recent.len() >= self.per_minute as usize {
            return Err(format!(
                "more than {} requests in a minute (requests_per_minute)",
                self.per_minute
            ));
        }
        let permit = self.in_flight.clone().try_acquire_owned().map_err(|_| {
            format!(
                "{} requests already in flight (requests_in_flight); finish or drop a response first",
                self.max_in_flight
            )
        })?;
        recent.push_back(now);
        Ok(permit)
    }

    /// Requests in flight now.
    pub fn in_flight(&self) -> u32 {
        self.max_in_flight
            .saturating_sub(self.in_flight.available_permits() as u32)
    }
}

/// One admitted request: its permit and, once it has one, its response body (which owns the
/// connection). Emptied when the request is done or its call ends.
#[derive(Default)]
struct Held {
    permit: Option<OwnedSemaphorePermit>,
    body: Option<WasiBody>,
}

/// The requests of the current export call of one plugin instance.
#[derive(Default)]
pub(crate) struct CallScope {
    ended: CancellationToken,
    held: Vec<Weak<Mutex<Held>>>,
}

/// A request admitted in a call: cancelled, with its permit and connection released, when the
/// call ends.
pub(super) struct Admitted {
    held: Arc<Mutex<Held>>,
    ended: CancellationToken,
}

impl CallScope {
    /// Registers a request admitted with `permit` in the current call.
    pub(super) fn admit(&mut self, permit: OwnedSemaphorePermit) -> Admitted {
        self.held.retain(|w| w.strong_count() > 0);
        let held = Arc::new(Mutex::new(Held {
            permit: Some(permit),
            body: None,
        }));
        self.held.push(Arc::downgrade(&held));
        Admitted {
            held,
            ended: self.ended.clone(),
        }
    }

    /// Ends the call: every request it made is cancelled, its permit returned and its
    /// connection closed, whether or not the guest still holds a handle to it.
    pub(crate) fn end(&mut self) {
        if self.held.is_empty() {
            return; // no request in this call: nothing to cancel (the common, cheap case)
        }
        self.ended.cancel();
        for held in self.held.drain(..) {
            if let Some(held) = held.upgrade() {
                let mut h = held.lock();
                h.permit = None;
                h.body = None;
            }
        }
        self.ended = CancellationToken::new();
    }
}

fn cancelled() -> HttpError {
    HttpError::InternalError(Some(
        "request cancelled: the export call that made it has returned".into(),
    ))
}

impl Admitted {
    /// Runs the send under the call's scope.
    pub(super) async fn send<F>(self, send: F) -> Result<http::Response<WasiBody>, HttpError>
    where
        F: std::future::Future<Output = Result<http::Response<WasiBody>, HttpError>>,
    {
        let outcome = tokio::select! {
            _ = self.ended.cancelled() => Err(cancelled()),
            r = send => r,
        };
        let response = match outcome {
            Ok(r) => r,
            Err(e) => {
                self.held.lock().permit = None;
                return Err(e);
            }
        };
        let (parts, body) = response.into_parts();
        {
            let mut h = self.held.lock();
            if h.permit.is_none() {
                // The call ended while the response arrived.
                return Err(cancelled());
            }
            h.body = Some(body);
        }
        let body = ScopedBody {
            held: self.held,
            done: false,
        }
        .boxed_unsync();
        Ok(http::Response::from_parts(parts, body))
    }
}

/// A response body that lives only as long as its call and its permit.
struct ScopedBody {
    held: Arc<Mutex<Held>>,
    done: bool,
}

impl http_body::Body for ScopedBody {
    type Data = Bytes;
    type Error = HttpError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, HttpError>>> {
        if self.done {
            return Poll::Ready(None);
        }
        let this = self.get_mut();
        let mut held = this.held.lock();
        let Some(body) = held.body.as_mut() else {
            return Poll::Ready(Some(Err(cancelled())));
        };
        let polled = Pin::new(body).poll_frame(cx);
        if let Poll::Ready(None) = polled {
            // Done: the connection went back to the pool inside the body; free the slot.
            held.body = None;
            held.permit = None;
            drop(held);
            this.done = true;
            return Poll::Ready(None);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.done
            || self
                .held
                .lock()
                .body
                .as_ref()
                .is_some_and(|b| b.is_end_stream())
    }
}

impl Drop for ScopedBody {
    fn drop(&mut self) {
        let mut held = self.held.lock();
        held.body = None;
        held.permit = None;
    }
}
