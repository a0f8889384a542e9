//! A small blocking HTTP client over `wasi:http`, for the plugins of this repository (built for
//! wasm32-wasip2); on other targets it compiles, and only [`split_url`] and the types work.
//!
//! A plugin's export call is synchronous, and the host bounds every wait in it, so the client
//! blocks: it builds the request, hands it to the host, waits once for the answer, and reads
//! the body with blocking reads. That is about 20 host calls a request, where an async client
//! (wstd, with its reactor and header maps) makes about twice as many; each host call costs
//! the host some 300 ns of wasmtime's machinery, on every request of every pool.
//!
//! The plugin template (`plugin-template/rust`) has the same client inline, so that a copied
//! template builds on its own.

pub mod unsettled;

use std::borrow::Cow;
use std::fmt;
use std::time::Duration;

use wasip2::http::outgoing_handler;
use wasip2::http::types::{
    Fields, IncomingResponse, Method as WasiMethod, OutgoingBody, OutgoingRequest, Scheme,
};
use wasip2::io::streams::StreamError;

/// The methods the plugins use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// GET.
    Get,
    /// HEAD.
    Head,
    /// POST.
    Post,
    /// PUT.
    Put,
    /// PATCH.
    Patch,
    /// DELETE.
    Delete,
}

impl Method {
    fn wasi(self) -> WasiMethod {
        match self {
            Method::Get => WasiMethod::Get,
            Method::Head => WasiMethod::Head,
            Method::Post => WasiMethod::Post,
            Method::Put => WasiMethod::Put,
            Method::Patch => WasiMethod::Patch,
            Method::Delete => WasiMethod::Delete,
        }
    }
}

/// One request. The `host` header comes from the URL; a body is sent with its length.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// The method.
    pub method: Method,
    /// `http://` or `https://`, an authority, and an optional path and query.
    pub url: &'a str,
    /// Header names and values, sent in this order.
    pub headers: &'a [(&'a str, &'a str)],
    /// The body, if any.
    pub body: Option<&'a [u8]>,
}

/// A whole answer.
#[derive(Debug, Clone)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// As the host gave them: names in lower case, in order.
    headers: Vec<(String, Vec<u8>)>,
    /// The whole body.
    pub body: Vec<u8>,
}

impl Response {
    /// The first value of header `name` (any case), if it is text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .and_then(|(_, v)| std::str::from_utf8(v).ok())
    }

    /// The status and the body as text. A success answer must be UTF-8: one that is not is
    /// an error, not ids and names with replacement characters in them. An error answer is
    /// only read for its message, so its invalid bytes are replaced.
    pub fn into_text(self) -> Result<(u16, String), Error> {
        let status = self.status;
        if (200..300).contains(&status) {
            String::from_utf8(self.body)
                .map(|text| (status, text))
                .map_err(|e| {
                    Error::Transport(format!(
                        "the answer (HTTP {status}) is not UTF-8: {}",
                        e.utf8_error()
                    ))
                })
        } else {
            Ok((status, String::from_utf8_lossy(&self.body).into_owned()))
        }
    }
}

/// Why a request failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// The request cannot be described to the host: a bad URL, header or method. Sending it
    /// again will not help.
    Invalid(String),
    /// It did not complete: refused by the host, a connection failure, a timeout, a broken or
    /// too large answer.
    Transport(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Invalid(m) | Error::Transport(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for Error {}

/// The largest answer read whole (the host caps it too).
pub const MAX_BODY: usize = 16 << 20;

/// A URL cut into what `wasi:http` asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target<'a> {
    /// `https`, else `http`.
    pub https: bool,
    /// Host and optional port.
    pub authority: &'a str,
    /// Starts with `/` (an empty path is `/`).
    pub path_and_query: Cow<'a, str>,
}

/// Cuts `url` into scheme, authority and path. Only `http` and `https` are spoken; there is no
/// user info, and nothing after a `#`.
pub fn split_url(url: &str) -> Result<Target<'_>, Error> {
    // The query is left out of the message: it can carry tokens (signed URLs, skip tokens).
    let shown = url.split(['?', '#']).next().unwrap_or_default();
    let bad = |why: &str| Error::Invalid(format!("bad URL {shown:?}: {why}"));
    let (https, rest) = if let Some(rest) = url.strip_prefix("https://") {
        (true, rest)
    } else if let Some(rest) = url.strip_prefix("http://") {
        (false, rest)
    } else {
        return Err(bad("not http:// or https://"));
    };
    let rest = rest.split_once('#').map_or(rest, |(before, _)| before);
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, path_and_query) = rest.split_at(end);
    if authority.is_empty() {
        return Err(bad("no host"));
    }
    if authority.contains('@') {
        return Err(bad("user info is not sent"));
    }
    if url.chars().any(|c| c.is_ascii_control() || c == ' ') {
        return Err(bad("spaces or control characters"));
    }
    Ok(Target {
        https,
        authority,
        path_and_query: if path_and_query.starts_with('/') {
            Cow::Borrowed(path_and_query)
        } else {
            Cow::Owned(format!("/{path_and_query}"))
        },
    })
}

/// Sends `request` and reads the whole answer, whatever its status.
pub fn send(request: &Request<'_>) -> Result<Response, Error> {
    let target = split_url(request.url)?;
    let invalid = |what: &str| Error::Invalid(format!("bad request: {what}"));
    let mut headers: Vec<(String, Vec<u8>)> = request
        .headers
        .iter()
        .map(|(n, v)| ((*n).to_string(), v.as_bytes().to_vec()))
        .collect();
    // Sent with its length, not chunked: some APIs refuse chunked requests. A POST, PUT or
    // PATCH without a body says `content-length: 0`, which some front ends require (411).
    let length = match (request.body, request.method) {
        (Some(body), _) => Some(body.len()),
        (None, Method::Post | Method::Put | Method::Patch) => Some(0),
        (None, _) => None,
    };
    if let Some(length) = length {
        headers.push((
            "content-length".to_string(),
            length.to_string().into_bytes(),
        ));
    }
    let fields = Fields::from_list(&headers).map_err(|e| invalid(&format!("headers: {e:?}")))?;
    let outgoing = OutgoingRequest::new(fields);
    // A new request is a GET already: one host call less for every GET.
    if request.method != Method::Get {
        outgoing
            .set_method(&request.method.wasi())
            .map_err(|()| invalid("method"))?;
    }
    let scheme = if target.https {
        Scheme::Https
    } else {
        Scheme::Http
    };
    outgoing
        .set_scheme(Some(&scheme))
        .map_err(|()| invalid("scheme"))?;
    outgoing
        .set_authority(Some(target.authority))
        .map_err(|()| invalid("authority"))?;
    outgoing
        .set_path_with_query(Some(&target.path_and_query))
        .map_err(|()| invalid("path"))?;
    // Without a body there is no body resource at all: the host sends an empty one.
    let body = match request.body {
        Some(_) => Some(outgoing.body().map_err(|()| invalid("body"))?),
        None => None,
    };
    let pending =
        outgoing_handler::handle(outgoing, None).map_err(|e| Error::Transport(format!("{e:?}")))?;
    let sent = match (body, request.body) {
        (Some(body), Some(bytes)) => write_body(body, bytes),
        _ => Ok(()),
    };
    // A request the host refused (or that failed) ends its body too: its answer says why, so
    // it is read before a failed write is reported.
    pending.subscribe().block();
    let response = match pending.get() {
        Some(Ok(Ok(response))) => response,
        Some(Ok(Err(e))) => return Err(Error::Transport(format!("{e:?}"))),
        _ => return Err(Error::Transport("no response".into())),
    };
    sent.map_err(|e| Error::Transport(format!("sending: {e}")))?;
    let status = response.status();
    let headers = {
        let fields = response.headers();
        fields.entries()
    };
    let body =
        read_body(&response).map_err(|e| Error::Transport(format!("reading the answer: {e}")))?;
    Ok(Response {
        status,
        headers,
        body,
    })
}

/// Writes a request body and finishes it (the stream goes first, as wasi:http asks).
fn write_body(body: OutgoingBody, bytes: &[u8]) -> Result<(), String> {
    let stream = body.write().map_err(|()| "no body stream".to_string())?;
    // `blocking-write-and-flush` takes at most 4096 bytes a call.
    for chunk in bytes.chunks(4096) {
        stream
            .blocking_write_and_flush(chunk)
            .map_err(|e| format!("{e:?}"))?;
    }
    drop(stream);
    OutgoingBody::finish(body, None).map_err(|e| format!("{e:?}"))
}

/// Reads a whole answer body, refusing more than [`MAX_BODY`] bytes.
fn read_body(response: &IncomingResponse) -> Result<Vec<u8>, String> {
    let body = response.consume().map_err(|()| "no body".to_string())?;
    let stream = body.stream().map_err(|()| "no body stream".to_string())?;
    let mut bytes = Vec::new();
    loop {
        match stream.blocking_read(64 * 1024) {
            Ok(chunk) if bytes.len() + chunk.len() <= MAX_BODY => bytes.extend(chunk),
            Ok(_) => return Err(format!("more than {MAX_BODY} bytes")),
            Err(StreamError::Closed) => return Ok(bytes),
            Err(StreamError::LastOperationFailed(e)) => return Err(e.to_debug_string()),
        }
    }
}

/// Sleeps inside the guest; the host's deadline for the call still runs.
pub fn sleep(delay: Duration) {
    let nanos = u64::try_from(delay.as_nanos()).unwrap_or(u64::MAX);
    wasip2::clocks::monotonic_clock::subscribe_duration(nanos).block();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_cut_as_wasi_http_asks() {
        let t = |url| split_url(url).map_err(|e| e.to_string());
        assert_eq!(
            t("https://compute.googleapis.com/compute/v1/projects/p?x=1"),
            Ok(Target {
                https: true,
                authority: "compute.googleapis.com",
                path_and_query: "/compute/v1/projects/p?x=1".into(),
            })
        );
        assert_eq!(
            t("http://127.0.0.1:8080"),
            Ok(Target {
                https: false,
                authority: "127.0.0.1:8080",
                path_and_query: "/".into(),
            })
        );
        assert_eq!(
            t("http://[::1]:9?a=b#frag"),
            Ok(Target {
                https: false,
                authority: "[::1]:9",
                path_and_query: "/?a=b".into(),
            })
        );
        for bad in [
            "ftp://host/",
            "host/path",
            "https:///path",
            "https://user:pw@host/",
            "https://host/a b",
            "https://host/\r\nx: y",
        ] {
            assert!(
                matches!(split_url(bad), Err(Error::Invalid(_))),
                "{bad} accepted"
            );
        }
    }

    #[test]
    fn headers_are_found_in_any_case() {
        let r = Response {
            status: 200,
            headers: vec![
                ("retry-after".into(), b"7".to_vec()),
                ("location".into(), vec![0xff]),
                ("retry-after".into(), b"9".to_vec()),
            ],
            body: b"ok".to_vec(),
        };
        assert_eq!(r.header("Retry-After"), Some("7"));
        assert_eq!(r.header("location"), None, "not text");
        assert_eq!(r.header("etag"), None);
        assert_eq!(r.into_text(), Ok((200, "ok".to_string())));
    }

    #[test]
    fn a_success_must_be_text_and_an_error_is_read_for_its_message() {
        let answer = |status, body: &[u8]| Response {
            status,
            headers: Vec::new(),
            body: body.to_vec(),
        };
        assert!(matches!(
            answer(200, b"{\"id\":\"vm-\xff\"}").into_text(),
            Err(Error::Transport(m)) if m.contains("not UTF-8")
        ));
        assert_eq!(
            answer(503, b"busy \xff").into_text(),
            Ok((503, "busy \u{fffd}".to_string()))
        );
    }

    #[test]
    fn the_query_stays_out_of_a_bad_url_message() {
        let e = split_url("https://u:p@host/path?sig=SECRET").map_err(|e| e.to_string());
        assert!(e.as_ref().is_err_and(|m| !m.contains("SECRET")), "{e:?}");
    }
}
