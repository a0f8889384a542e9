//! A loopback HTTP server for egress tests. It records what arrives and serves
//! `/ok` (a small body), `/huge` (1 GB, streamed lazily), `/stall` (headers, then silence)
//! and `/echo` (the request's headers reflected back: each as an `x-echo-<name>` response
//! header, and all as `name: value` lines in a body sent in 5-byte chunks, as a server that
//! echoes TRACE would).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::body::{Bytes, Frame, Incoming};
use hyper::{Request, Response};

/// What one request looked like on arrival.
#[derive(Debug, Clone)]
pub struct Arrival {
    pub path: String,
    pub headers: Vec<(String, String)>,
}

#[derive(Clone)]
pub struct Peer {
    pub addr: SocketAddr,
    arrivals: Arc<Mutex<Vec<Arrival>>>,
}

type Body = BoxBody<Bytes, Infallible>;

impl Peer {
    pub async fn start() -> Peer {
        let arrivals = Arc::new(Mutex::new(Vec::new()));
        let shared = arrivals.clone();
        let addr = crate::serve::serve_http(move |req| handle(shared.clone(), req)).await;
        Peer { addr, arrivals }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub fn arrivals(&self) -> Vec<Arrival> {
        self.arrivals.lock().map(|a| a.clone()).unwrap_or_default()
    }
}

async fn handle(
    arrivals: Arc<Mutex<Vec<Arrival>>>,
    req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let path = req.uri().path().to_string();
    let headers = crate::serve::headers(&req);
    if let Ok(mut a) = arrivals.lock() {
        a.push(Arrival {
            path: path.clone(),
            headers,
        });
    }
    let echoed: Vec<(String, String)> = crate::serve::headers(&req);
    let received = req
        .into_body()
        .collect()
        .await
        .map_or(0, |b| b.to_bytes().len());
    if path == "/count" {
        // How many body bytes arrived, for tests that stream a request body.
        return Ok(Response::new(
            Full::new(Bytes::from(received.to_string())).boxed(),
        ));
    }
    if path == "/echo" {
        let mut response = Response::builder();
        let mut text = String::new();
        for (k, v) in &echoed {
            response = response.header(format!("x-echo-{k}"), v.as_str());
            text.push_str(&format!("{k}: {v}\n"));
        }
        let chunks: Vec<Bytes> = text
            .as_bytes()
            .chunks(5)
            .map(Bytes::copy_from_slice)
            .collect();
        let stream = tokio_stream_iter(chunks.into_iter().map(|c| Ok(Frame::data(c))));
        return Ok(response
            .body(StreamBody::new(stream).boxed())
            .unwrap_or_else(|_| Response::new(Full::new(Bytes::new()).boxed())));
    }
    let body: Body = match path.as_str() {
        "/huge" => {
            let chunk = Bytes::from(vec![b'x'; 1 << 20]);
            let stream = futures_util_stream(chunk, 1024);
            StreamBody::new(stream).boxed()
        }
        "/stall" => {
            let stream = async_stream_stall();
            StreamBody::new(stream).boxed()
        }
        _ => Full::new(Bytes::from_static(b"hello")).boxed(),
    };
    Ok(Response::new(body))
}

/// `n` copies of `chunk`, produced on demand.
fn futures_util_stream(
    chunk: Bytes,
    n: usize,
) -> impl futures_core::Stream<Item = Result<Frame<Bytes>, Infallible>> + Send + Sync + 'static {
    tokio_stream_iter((0..n).map(move |_| Ok(Frame::data(chunk.clone()))))
}

fn tokio_stream_iter<I>(
    iter: I,
) -> impl futures_core::Stream<Item = I::Item> + Send + Sync + 'static
where
    I: Iterator + Send + Sync + Unpin + 'static,
{
    struct It<I>(I);
    impl<I: Iterator + Unpin> futures_core::Stream for It<I> {
        type Item = I::Item;
        fn poll_next(
            mut self: std::pin::Pin<&mut Self>,
            _cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<I::Item>> {
            std::task::Poll::Ready(self.0.next())
        }
    }
    It(iter)
}

/// A body that never produces a byte (but keeps the connection open for an hour).
fn async_stream_stall()
-> impl futures_core::Stream<Item = Result<Frame<Bytes>, Infallible>> + Send + Sync + 'static {
    struct Stall(std::pin::Pin<Box<tokio::time::Sleep>>);
    impl futures_core::Stream for Stall {
        type Item = Result<Frame<Bytes>, Infallible>;
        fn poll_next(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Self::Item>> {
            match self.0.as_mut().poll(cx) {
                std::task::Poll::Ready(()) => std::task::Poll::Ready(None),
                std::task::Poll::Pending => std::task::Poll::Pending,
            }
        }
    }
    use std::future::Future;
    // Deliberate: a peer that never answers.
    Stall(Box::pin(tokio::time::sleep(Duration::from_secs(3600))))
}
