//! The channels a lease holder opened through the host (Docker requests, their streamed
//! answers, upgraded exec and attach connections), grouped by lease, so that they end with
//! the lease: whoever sees the lease end calls [`LeaseChannels::end`], and every channel
//! opened under it is cut, however long it was meant to run.
//!
//! Owns: one cancellation token per lease with open channels, and the body wrapper that ends
//! a streamed answer when its token fires. Must not know: lease states or the scaler; the
//! caller decides when a lease is over.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use hyper::body::{Body, Frame, SizeHint};
use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

/// The open channels of one pool's leases.
#[derive(Debug, Default)]
pub struct LeaseChannels {
    tokens: Mutex<HashMap<u64, CancellationToken>>,
}

impl LeaseChannels {
    /// The token every channel of `lease` is tied to (created on first use).
    pub fn token(&self, lease: u64) -> CancellationToken {
        self.tokens.lock().entry(lease).or_default().clone()
    }

    /// Cuts every channel opened for `lease` and forgets it.
    pub fn end(&self, lease: u64) {
        if let Some(token) = self.tokens.lock().remove(&lease) {
            token.cancel();
        }
    }

    /// The leases that have (or had, until their end is noticed) channels open.
    pub fn leases(&self) -> Vec<u64> {
        self.tokens.lock().keys().copied().collect()
    }
}

/// A response body that ends with an error the moment its lease's token fires; the server
/// then closes the caller's connection, and dropping the inner body closes the engine's.
pub struct LeaseBody<B> {
    inner: B,
    ended: Pin<Box<dyn Future<Output = ()> + Send + Sync>>,
    /// Whether `inner` has been read to its end (and not cut).
    read: bool,
    /// What to do with the body's connection once it is dropped read to its end.
    when_read: Option<Box<dyn FnOnce() + Send + Sync>>,
}

impl<B: Body> LeaseBody<B> {
    /// `inner`, cut when `token` is cancelled.
    pub fn new(inner: B, token: CancellationToken) -> Self {
        LeaseBody {
            read: inner.is_end_stream(),
            inner,
            ended: Box::pin(token.cancelled_owned()),
            when_read: None,
        }
    }

    /// Runs `then` when the body is dropped after it was read to its end (its connection can
    /// carry another request); never when it was cut or dropped before its end.
    pub(crate) fn when_read(mut self, then: impl FnOnce() + Send + Sync + 'static) -> Self {
        self.when_read = Some(Box::new(then));
        self
    }
}

impl<B> Drop for LeaseBody<B> {
    fn drop(&mut self) {
        if self.read
            && let Some(then) = self.when_read.take()
        {
            then();
        }
    }
}

/// The error a cut body ends with.
#[derive(Debug, thiserror::Error)]
#[error("the lease ended; its Docker stream is closed")]
pub struct LeaseEnded;

impl<B> Body for LeaseBody<B>
where
    B: Body + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Data = B::Data;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        if this.ended.as_mut().poll(cx).is_ready() {
            this.read = false;
            return Poll::Ready(Some(Err(Box::new(LeaseEnded))));
        }
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        // A server stops polling once `is_end_stream` says so; another reads to `None`.
        this.read = match &polled {
            Poll::Ready(None) => true,
            Poll::Ready(Some(Err(_))) => false,
            _ => this.inner.is_end_stream(),
        };
        polled.map(|frame| frame.map(|f| f.map_err(Into::into)))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, StreamBody};

    #[tokio::test]
    async fn a_body_ends_when_its_lease_ends_and_other_leases_are_untouched() {
        let channels = LeaseChannels::default();
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<bytes::Bytes>, std::io::Error>>(4);
        let stream = tokio_stream_from(rx);
        let mut body = LeaseBody::new(StreamBody::new(stream), channels.token(7));
        let other = channels.token(8);
        tx.send(Ok(Frame::data(bytes::Bytes::from_static(b"one"))))
            .await
            .expect("send");
        let first = body.frame().await.expect("a frame").expect("data");
        assert_eq!(first.into_data().expect("data"), "one");
        channels.end(7);
        let cut = tokio::time::timeout(std::time::Duration::from_secs(1), body.frame())
            .await
            .expect("the body ends at once");
        assert!(matches!(cut, Some(Err(_))), "{cut:?}");
        assert!(!other.is_cancelled());
        assert_eq!(channels.leases(), vec![8]);
    }

    fn tokio_stream_from<T: Send + 'static>(
        mut rx: tokio::sync::mpsc::Receiver<T>,
    ) -> impl futures_core::Stream<Item = T> + Unpin {
        Box::pin(futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx)))
    }
}
