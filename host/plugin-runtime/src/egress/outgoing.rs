//! `wasi:http/outgoing-handler.handle` and the `future-incoming-response` it returns, with the
//! request polled in the task of the call that made it.
//!
//! wasmtime-wasi-http's own `handle` spawns two tokio tasks for every request (the send, and
//! its I/O), and the guest's pollable waits on the first one's join handle. Each request then
//! wakes another worker thread, and its answer comes back across threads: on a loopback GET
//! that doubled the guest's latency against a native client. Here the send future lives in
//! the resource itself, and the guest's wait polls it, as a native client's task polls its own
//! request. A task is spawned only when the request makes progress while the guest waits on
//! something else (a guest that writes a large body before it waits for the response, or a
//! request the end of its call cancels), and it polls the request once.
//!
//! These definitions shadow wasmtime-wasi-http's in the linker. The egress hook's
//! `send_request`, which only that crate's `handle` calls, refuses every request, so a linker
//! in which the shadowing did not take makes every guest request fail rather than take the
//! spawning path unnoticed.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake, Waker};

use http_body_util::{BodyExt, Empty};
use parking_lot::Mutex;
use wasmtime::StoreContextMut;
use wasmtime::component::{Linker, Resource, ResourceType};
use wasmtime_wasi::p2::Pollable;
use wasmtime_wasi_http::p2::bindings::http::types::{
    ErrorCode, HostFutureIncomingResponse as _, Method, Scheme,
};
use wasmtime_wasi_http::p2::body::HostIncomingBody;
use wasmtime_wasi_http::p2::types::{
    HostFutureIncomingResponse, HostIncomingResponse, HostOutgoingRequest,
};
use wasmtime_wasi_http::{Error as HttpError, FieldMap, RequestOptions, WasiBody, WasiHttpView};

use crate::HostState;

/// The version of `wasi:http` that wasmtime-wasi-http 48 links (its `wit/deps/http.wit`). The
/// linker serves every 0.2.x import from it.
const WASI_HTTP: &str = "0.2.12";

/// What `handle` starts: the request through the egress policy, up to the response's head.
pub(crate) type Sending =
    Pin<Box<dyn Future<Output = Result<http::Response<WasiBody>, HttpError>> + Send>>;

/// Replaces wasmtime-wasi-http's `handle` and `future-incoming-response` in `linker` (which
/// must already hold that crate's definitions).
pub(crate) fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    linker.allow_shadowing(true);
    let shadowed = shadow(linker);
    linker.allow_shadowing(false);
    shadowed
}

fn shadow(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    let mut types = linker.instance(&format!("wasi:http/types@{WASI_HTTP}"))?;
    types.resource(
        "future-incoming-response",
        ResourceType::host::<FutureResponse>(),
        |mut store: StoreContextMut<'_, HostState>, rep| {
            store
                .data_mut()
                .table
                .delete(Resource::<FutureResponse>::new_own(rep))?;
            Ok(())
        },
    )?;
    types.func_wrap(
        "[method]future-incoming-response.subscribe",
        |mut store: StoreContextMut<'_, HostState>, (this,): (Resource<FutureResponse>,)| {
            Ok((wasmtime_wasi::p2::subscribe(
                &mut store.data_mut().table,
                this,
            )?,))
        },
    )?;
    types.func_wrap(
        "[method]future-incoming-response.get",
        |mut store: StoreContextMut<'_, HostState>, (this,): (Resource<FutureResponse>,)| {
            Ok((get(store.data_mut(), &this)?,))
        },
    )?;
    let mut handler = linker.instance(&format!("wasi:http/outgoing-handler@{WASI_HTTP}"))?;
    handler.func_wrap(
        "handle",
        |mut store: StoreContextMut<'_, HostState>,
         (request, options): (
            Resource<HostOutgoingRequest>,
            Option<Resource<RequestOptions>>,
        )| { Ok((handle(store.data_mut(), request, options)?,)) },
    )?;
    Ok(())
}

/// `outgoing-handler.handle`: builds the request, starts it through the egress hook, and polls
/// it once, so that it is on its way (or refused) before `handle` returns.
fn handle(
    state: &mut HostState,
    request: Resource<HostOutgoingRequest>,
    options: Option<Resource<RequestOptions>>,
) -> wasmtime::Result<Result<Resource<FutureResponse>, ErrorCode>> {
    // The options are the guest's to give: `handle` owns them.
    let options = match options {
        Some(o) => Some(state.table.delete(o)?),
        None => None,
    };
    let request = state.table.delete(request)?;
    let request = match build(request) {
        Ok(r) => r,
        Err(code) => return Ok(Err(code)),
    };
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return Ok(Err(ErrorCode::InternalError(Some(
            "no async runtime to send the request on".into(),
        ))));
    };
    let shared = Arc::new(Shared {
        state: Mutex::new(State::Sending(state.hooks.start(request, options))),
        done: AtomicBool::new(false),
        scheduled: AtomicBool::new(false),
        waiter: Mutex::new(Waiter::default()),
        runtime,
    });
    shared.poll_send();
    Ok(Ok(state.table.push(FutureResponse(shared))?))
}

/// `future-incoming-response.get`: the response once it has arrived (once only), `None` before.
#[allow(clippy::type_complexity)] // the WIT's own result type
fn get(
    state: &mut HostState,
    this: &Resource<FutureResponse>,
) -> wasmtime::Result<Option<Result<Result<Resource<HostIncomingResponse>, ErrorCode>, ()>>> {
    let shared = state.table.get(this)?.0.clone();
    // A guest may ask before it waits; the request then moves on in the guest's own time.
    shared.poll_send();
    let done = {
        let mut slot = shared.state.lock();
        match std::mem::replace(&mut *slot, State::Taken) {
            State::Sending(sending) => {
                *slot = State::Sending(sending);
                return Ok(None);
            }
            State::Taken => return Ok(Some(Err(()))),
            State::Done(done) => done,
        }
    };
    let response = match done {
        Ok(response) => response,
        Err(e) => return Ok(Some(Ok(Err(error_code(state, e)?)))),
    };
    let (parts, body) = response.into_parts();
    let headers = FieldMap::new_immutable(&mut state.hooks, parts.headers);
    let response = state.table.push(HostIncomingResponse {
        status: parts.status.as_u16(),
        headers,
        body: Some(HostIncomingBody::new(body)),
    })?;
    Ok(Some(Ok(Ok(response))))
}

/// The guest's error code for a failed send. The mapping is wasmtime-wasi-http's own, which it
/// applies only in its `future-incoming-response.get`; so the error goes through that, in a
/// resource of its type that lives for this call only.
fn error_code(state: &mut HostState, e: HttpError) -> wasmtime::Result<ErrorCode> {
    let Ok(id) = state.table.push(HostFutureIncomingResponse::Ready(Err(e))) else {
        // The guest's table is full: it still gets an error code, not a trap.
        return Ok(ErrorCode::InternalError(Some(
            "the request failed (resource table full)".into(),
        )));
    };
    let answer = state
        .http()
        .get(Resource::<HostFutureIncomingResponse>::new_borrow(id.rep()));
    state.table.delete(id)?;
    Ok(match answer? {
        Some(Ok(Err(code))) => code,
        _ => ErrorCode::InternalError(Some("the request failed".into())),
    })
}

/// The `http::Request` the guest described, checked as wasi:http specifies: a scheme (the
/// pool sets no default), a valid URI and method, and no `content-length` a missing body
/// cannot honour. The `host` header comes from the authority.
fn build(request: HostOutgoingRequest) -> Result<http::Request<WasiBody>, ErrorCode> {
    let declared = content_length(&request.headers)?;
    if request.body.is_none() && declared.is_some_and(|n| n != 0) {
        return Err(ErrorCode::HttpRequestBodySize(Some(0)));
    }
    let method = match request.method {
        Method::Get => http::Method::GET,
        Method::Head => http::Method::HEAD,
        Method::Post => http::Method::POST,
        Method::Put => http::Method::PUT,
        Method::Delete => http::Method::DELETE,
        Method::Connect => http::Method::CONNECT,
        Method::Options => http::Method::OPTIONS,
        Method::Trace => http::Method::TRACE,
        Method::Patch => http::Method::PATCH,
        Method::Other(m) => http::Method::from_bytes(m.as_bytes())
            .map_err(|_| ErrorCode::HttpRequestMethodInvalid)?,
    };
    let scheme = match request.scheme {
        Some(Scheme::Http) => http::uri::Scheme::HTTP,
        Some(Scheme::Https) => http::uri::Scheme::HTTPS,
        // Spelled as text, `http` and `https` are still the two schemes the host speaks.
        Some(Scheme::Other(other)) => match http::uri::Scheme::try_from(other.as_str()) {
            Ok(s) if s == http::uri::Scheme::HTTP || s == http::uri::Scheme::HTTPS => s,
            _ => return Err(ErrorCode::HttpProtocolError),
        },
        // The pool sets no default scheme.
        None => return Err(ErrorCode::HttpProtocolError),
    };
    let authority = request.authority.unwrap_or_default();
    let mut uri = http::Uri::builder()
        .scheme(scheme)
        .authority(authority.as_str());
    if let Some(path) = request.path_with_query {
        uri = uri.path_and_query(path);
    }
    let uri = uri
        .build()
        .map_err(wasmtime_wasi_http::p2::http_request_error)?;
    // `try_`: a map past http's size limit is the guest's error, not a host panic.
    let full = |_| ErrorCode::HttpRequestHeaderSectionSize(None);
    let mut headers =
        http::HeaderMap::try_with_capacity(request.headers.len() + 1).map_err(full)?;
    headers
        .try_insert(
            http::header::HOST,
            http::HeaderValue::from_str(&authority)
                .map_err(|_| ErrorCode::HttpRequestUriInvalid)?,
        )
        .map_err(full)?;
    for (name, value) in request.headers.iter() {
        headers
            .try_append(name.clone(), value.clone())
            .map_err(full)?;
    }
    let body = request
        .body
        .unwrap_or_else(|| Empty::new().map_err(|never| match never {}).boxed_unsync());
    let mut built = http::Request::new(body);
    *built.method_mut() = method;
    *built.uri_mut() = uri;
    *built.headers_mut() = headers;
    Ok(built)
}

/// The one `content-length` a request may declare (RFC 9110: `1*DIGIT`).
fn content_length(headers: &http::HeaderMap) -> Result<Option<u64>, ErrorCode> {
    let bad = |why: &str| ErrorCode::InternalError(Some(format!("content-length: {why}")));
    let mut values = headers.get_all(http::header::CONTENT_LENGTH).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(bad("more than one value"));
    }
    let digits = value.as_bytes();
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return Err(bad("not a number"));
    }
    std::str::from_utf8(digits)
        .ok()
        .and_then(|s| s.parse().ok())
        .map(Some)
        .ok_or_else(|| bad("too large"))
}

/// The host side of a `future-incoming-response`.
pub(crate) struct FutureResponse(Arc<Shared>);

impl Drop for FutureResponse {
    fn drop(&mut self) {
        // The guest let go of it: the request is cancelled now, not at a driver's next poll,
        // and wake-ups from here on are stale.
        self.0.done.store(true, Ordering::Release);
        let dropped = std::mem::replace(&mut *self.0.state.lock(), State::Taken);
        drop(dropped);
    }
}

enum State {
    Sending(Sending),
    Done(Result<http::Response<WasiBody>, HttpError>),
    /// Handed to the guest, or dropped.
    Taken,
}

/// One request in flight, and who is waiting for it.
struct Shared {
    state: Mutex<State>,
    /// Set once the send has ended; wake-ups after that are stale.
    done: AtomicBool,
    /// A driver task is queued and has not started polling yet: one is enough, however many
    /// wake-ups arrive meanwhile (a guest can make many, for example by spending its tokio
    /// budget so that every timer and channel it polls defers its wake-up).
    scheduled: AtomicBool,
    waiter: Mutex<Waiter>,
    runtime: tokio::runtime::Handle,
}

/// The guest's wait on the request, if it is waiting on it now.
#[derive(Default)]
struct Waiter {
    waker: Option<Waker>,
    /// A wake-up went to that waker, and the guest has not polled the request since: if the
    /// wait ends without a poll, the wake-up is passed on to a task.
    handed: bool,
}

impl Shared {
    /// Polls the request once, with its own waker; true once it is done.
    fn poll_send(self: &Arc<Self>) -> bool {
        let mut state = self.state.lock();
        let State::Sending(sending) = &mut *state else {
            return true;
        };
        let waker = Waker::from(self.clone());
        match sending.as_mut().poll(&mut Context::from_waker(&waker)) {
            Poll::Ready(done) => {
                *state = State::Done(done);
                self.done.store(true, Ordering::Release);
                true
            }
            Poll::Pending => false,
        }
    }

    /// Polls the request once in a task of its own, for a wake-up no guest wait will take.
    fn drive(self: Arc<Self>) {
        if self.scheduled.swap(true, Ordering::AcqRel) {
            return;
        }
        let runtime = self.runtime.clone();
        runtime.spawn(async move {
            // Cleared before the poll: a wake-up during it queues the next one.
            self.scheduled.store(false, Ordering::Release);
            if self.poll_send() {
                let waiting = self.waiter.lock().waker.take();
                if let Some(waker) = waiting {
                    waker.wake();
                }
            }
        });
    }
}

impl Wake for Shared {
    fn wake(self: Arc<Self>) {
        if self.done.load(Ordering::Acquire) {
            // A stale registration (a socket or timer the request polled before it ended).
            return;
        }
        let waiting = {
            let mut waiter = self.waiter.lock();
            let waker = waiter.waker.take();
            waiter.handed |= waker.is_some();
            waker
        };
        match waiting {
            Some(waker) => waker.wake(),
            None => self.drive(),
        }
    }
}

/// Ends a guest's wait: a wake-up handed to it and not acted on goes to a task instead.
struct Waiting<'a>(&'a Arc<Shared>);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let lost = {
            let mut waiter = self.0.waiter.lock();
            waiter.waker = None;
            std::mem::take(&mut waiter.handed)
        };
        if lost {
            self.0.clone().drive();
        }
    }
}

#[async_trait::async_trait]
impl Pollable for FutureResponse {
    async fn ready(&mut self) {
        let shared = &self.0;
        let _waiting = Waiting(shared);
        std::future::poll_fn(|cx| {
            {
                let mut waiter = shared.waiter.lock();
                waiter.handed = false;
                if !waiter
                    .waker
                    .as_ref()
                    .is_some_and(|w| w.will_wake(cx.waker()))
                {
                    waiter.waker = Some(cx.waker().clone());
                }
            }
            if shared.poll_send() {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
        .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(values: &[&str]) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        for v in values {
            h.append(
                http::header::CONTENT_LENGTH,
                http::HeaderValue::from_str(v).unwrap_or_else(|e| panic!("{e}")),
            );
        }
        h
    }

    #[test]
    fn content_length_is_digits_once() {
        assert!(matches!(content_length(&headers(&[])), Ok(None)));
        assert!(matches!(content_length(&headers(&["0"])), Ok(Some(0))));
        assert!(matches!(content_length(&headers(&["12"])), Ok(Some(12))));
        for bad in [
            &["+1"][..],
            &["1 "],
            &[""],
            &["1", "1"],
            &["99999999999999999999999"],
        ] {
            assert!(
                matches!(
                    content_length(&headers(bad)),
                    Err(ErrorCode::InternalError(_))
                ),
                "{bad:?}"
            );
        }
    }

    fn outgoing(scheme: Option<Scheme>, path: Option<&str>) -> HostOutgoingRequest {
        HostOutgoingRequest {
            method: Method::Get,
            scheme,
            authority: Some("cloud.example:8080".into()),
            path_with_query: path.map(str::to_string),
            headers: FieldMap::default(),
            body: None,
        }
    }

    #[test]
    fn requests_are_built_as_wasi_http_specifies() {
        let built = build(outgoing(Some(Scheme::Https), Some("/v1?x=1")))
            .unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(built.uri(), "https://cloud.example:8080/v1?x=1");
        assert_eq!(built.headers()["host"], "cloud.example:8080");
        // The scheme spelled as text is the same scheme.
        let built = build(outgoing(Some(Scheme::Other("http".into())), Some("/")))
            .unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(built.uri().scheme_str(), Some("http"));
        for refused in [
            outgoing(None, Some("/")),
            outgoing(Some(Scheme::Other("ftp".into())), Some("/")),
            outgoing(Some(Scheme::Http), None),
        ] {
            assert!(
                matches!(build(refused), Err(ErrorCode::HttpProtocolError)),
                "accepted"
            );
        }
        let mut declared = outgoing(Some(Scheme::Http), Some("/"));
        declared.headers =
            FieldMap::new_immutable(wasmtime_wasi_http::default_hooks(), headers(&["5"]));
        assert!(matches!(
            build(declared),
            Err(ErrorCode::HttpRequestBodySize(Some(0)))
        ));
    }

    /// A request that completes when `go` is sent, and whether it is done.
    fn request() -> (FutureResponse, tokio::sync::oneshot::Sender<()>) {
        let (go, rx) = tokio::sync::oneshot::channel::<()>();
        let mut rx = Some(rx);
        let sending: Sending = Box::pin(std::future::poll_fn(move |cx| {
            if let Some(r) = rx.as_mut() {
                if Pin::new(r).poll(cx).is_pending() {
                    return Poll::Pending;
                }
                rx = None;
            }
            Poll::Ready(Err(HttpError::ConnectionRefused))
        }));
        (in_flight(sending), go)
    }

    fn in_flight(sending: Sending) -> FutureResponse {
        FutureResponse(Arc::new(Shared {
            state: Mutex::new(State::Sending(sending)),
            done: AtomicBool::new(false),
            scheduled: AtomicBool::new(false),
            waiter: Mutex::new(Waiter::default()),
            runtime: tokio::runtime::Handle::current(),
        }))
    }

    /// The guest's wait on `response`, polled once; then the request makes progress, and the
    /// wait's waker must have been woken.
    fn woken_wait(
        response: &mut FutureResponse,
        go: tokio::sync::oneshot::Sender<()>,
    ) -> (Pin<Box<dyn Future<Output = ()> + Send + '_>>, Waker) {
        let flag = Arc::new(Flag(AtomicBool::new(false)));
        let waker = Waker::from(flag.clone());
        let mut wait = response.ready();
        assert!(
            wait.as_mut()
                .poll(&mut Context::from_waker(&waker))
                .is_pending()
        );
        let _ = go.send(());
        assert!(
            flag.0.load(Ordering::SeqCst),
            "the waiting guest was not woken"
        );
        (wait, waker)
    }

    async fn driven(response: &FutureResponse) -> bool {
        for _ in 0..200 {
            if matches!(*response.0.state.lock(), State::Done(_)) {
                return true;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        false
    }

    /// A noop-like waker that records whether it was woken.
    struct Flag(AtomicBool);
    impl Wake for Flag {
        fn wake(self: Arc<Self>) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    /// The request makes progress while the guest waits on something else (a guest writing a
    /// large body before it waits for the response): a task polls it.
    #[tokio::test]
    async fn progress_while_the_guest_waits_elsewhere_drives_the_request() {
        let (mut response, go) = request();
        assert!(futures_util::FutureExt::now_or_never(response.ready()).is_none());
        let _ = go.send(());
        assert!(driven(&response).await, "nothing polled the request");
    }

    /// A wake-up handed to the guest's wait just as that wait ends (its `poll` returned for
    /// another pollable) is not lost: a task polls the request instead.
    #[tokio::test]
    async fn a_wake_up_handed_to_an_ended_wait_still_drives_the_request() {
        let (mut response, go) = request();
        // The wait ends without polling again.
        drop(woken_wait(&mut response, go));
        assert!(driven(&response).await, "the wake-up was lost");
    }

    /// However many wake-ups arrive while no guest waits, one task is queued to poll the
    /// request, not one per wake-up.
    #[tokio::test]
    async fn a_burst_of_wake_ups_queues_one_driver() {
        let polls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = polls.clone();
        let sending: Sending = Box::pin(std::future::poll_fn(move |_| {
            counted.fetch_add(1, Ordering::SeqCst);
            Poll::Pending
        }));
        let response = in_flight(sending);
        let waker = Waker::from(response.0.clone());
        for _ in 0..100 {
            waker.wake_by_ref();
        }
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert_eq!(polls.load(Ordering::SeqCst), 1);
    }

    /// While the guest waits, the wake-up goes to the guest's own task, which polls the request.
    #[tokio::test]
    async fn a_waiting_guest_is_woken_and_polls_the_request_itself() {
        let (mut response, go) = request();
        let (mut wait, waker) = woken_wait(&mut response, go);
        assert!(
            wait.as_mut()
                .poll(&mut Context::from_waker(&waker))
                .is_ready()
        );
    }
}
