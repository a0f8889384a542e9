//! Secrets never come back: the secret values a credential put on a request are masked in
//! that request's response (headers, body and trailers) before the guest reads it, so a host
//! that reflects requests (TRACE, an echo endpoint, an error page quoting the request) cannot
//! hand the guest the token it was never meant to see.
//!
//! Masking replaces each occurrence with `*` of the same length, so `content-length` stays
//! true. The body is scrubbed as it streams: only the last `longest secret − 1` bytes are held
//! back between chunks, so an occurrence split across chunks is still caught and the body is
//! never held whole.
//!
//! What this cannot catch: a host that transforms the secret before echoing it (re-encodes,
//! hashes, splits or quotes it). Bind credentials only to hosts that do not do that.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http::HeaderMap;
use http_body_util::BodyExt;
use memchr::memmem;
use wasmtime_wasi_http::{Error as HttpError, WasiBody};
use zeroize::Zeroizing;

/// Secret values shorter than this are not masked (too likely to hit ordinary text, and too
/// short to be a credential).
const MIN_SECRET: usize = 6;

/// The secret values one request carries.
pub(super) struct Secrets {
    patterns: Vec<Zeroizing<Vec<u8>>>,
    longest: usize,
}

impl Secrets {
    /// The values of the request's sensitive headers (those a credential set: `Authorization`
    /// for bearer and basic, the SigV4 session token), each whole and, for `scheme token`
    /// values, the token alone. `None` when there are none.
    pub(super) fn of_request<B>(request: &http::Request<B>) -> Option<Secrets> {
        let mut patterns: Vec<Zeroizing<Vec<u8>>> = Vec::new();
        for value in request.headers().values().filter(|v| v.is_sensitive()) {
            let bytes = value.as_bytes();
            patterns.push(Zeroizing::new(bytes.to_vec()));
            if let Some(token) = bytes
                .iter()
                .position(|b| *b == b' ')
                .and_then(|space| bytes.get(space + 1..))
            {
                patterns.push(Zeroizing::new(token.to_vec()));
            }
        }
        patterns.retain(|p| p.len() >= MIN_SECRET);
        // Longest first, so a whole value is masked before its token part.
        patterns.sort_by_key(|p| std::cmp::Reverse(p.len()));
        let longest = patterns.first()?.len();
        Some(Secrets { patterns, longest })
    }

    /// Masks every occurrence in `buf`; returns how many were masked.
    fn mask(&self, buf: &mut [u8]) -> usize {
        let mut masked = 0;
        for p in &self.patterns {
            let finder = memmem::Finder::new(p.as_slice());
            let mut from = 0;
            while let Some(at) = buf.get(from..).and_then(|rest| finder.find(rest)) {
                let start = from + at;
                let end = start + p.len();
                if let Some(hit) = buf.get_mut(start..end) {
                    hit.fill(b'*');
                }
                masked += 1;
                from = end;
            }
        }
        masked
    }

    /// Masks the secrets in header values; returns how many values were changed.
    pub(super) fn mask_headers(&self, headers: &mut HeaderMap) -> usize {
        let mut changed = 0;
        for value in headers.values_mut() {
            let mut bytes = value.as_bytes().to_vec();
            if self.mask(&mut bytes) > 0
                && let Ok(v) = http::HeaderValue::from_bytes(&bytes)
            {
                *value = v;
                changed += 1;
            }
        }
        changed
    }

    /// The response body with the secrets masked as it streams.
    pub(super) fn body(self, inner: WasiBody) -> WasiBody {
        ScrubBody {
            inner,
            secrets: self,
            carry: BytesMut::new(),
            trailers: None,
            inner_done: false,
        }
        .boxed_unsync()
    }
}

struct ScrubBody {
    inner: WasiBody,
    secrets: Secrets,
    /// Bytes not yet sent, masked as far as they can be (the tail may start an occurrence).
    carry: BytesMut,
    /// Trailers waiting for the carry to go out first.
    trailers: Option<http_body::Frame<Bytes>>,
    inner_done: bool,
}

impl http_body::Body for ScrubBody {
    type Data = Bytes;
    type Error = HttpError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, HttpError>>> {
        let this = self.get_mut();
        loop {
            if this.inner_done {
                if !this.carry.is_empty() {
                    let rest = this.carry.split().freeze();
                    return Poll::Ready(Some(Ok(http_body::Frame::data(rest))));
                }
                return Poll::Ready(this.trailers.take().map(Ok));
            }
            match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
                Poll::Ready(None) => this.inner_done = true,
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => {
                        this.carry.extend_from_slice(&data);
                        this.secrets.mask(&mut this.carry);
                        let keep = (this.secrets.longest - 1).min(this.carry.len());
                        let ready = this.carry.len() - keep;
                        if ready > 0 {
                            let out = this.carry.split_to(ready).freeze();
                            return Poll::Ready(Some(Ok(http_body::Frame::data(out))));
                        }
                    }
                    Err(mut other) => {
                        if let Some(t) = other.trailers_mut() {
                            this.secrets.mask_headers(t);
                        }
                        // Trailers end the body; the held-back bytes go out before them.
                        this.trailers = Some(other);
                        this.inner_done = true;
                    }
                },
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner_done && self.carry.is_empty() && self.trailers.is_none()
    }
}

#[cfg(test)]
#[allow(clippy::indexing_slicing)] // test code: a failed assumption is a failed test
mod tests {
    use super::*;

    fn secrets(values: &[&str]) -> Secrets {
        let mut req = http::Request::new(());
        for (i, v) in values.iter().enumerate() {
            let mut value = http::HeaderValue::from_str(v).unwrap_or_else(|e| panic!("{e}"));
            value.set_sensitive(true);
            req.headers_mut().insert(
                http::HeaderName::from_bytes(format!("x-secret-{i}").as_bytes())
                    .unwrap_or_else(|e| panic!("{e}")),
                value,
            );
        }
        req.headers_mut().insert(
            "x-plain",
            http::HeaderValue::from_static("not-a-secret-value"),
        );
        Secrets::of_request(&req).unwrap_or_else(|| panic!("no secrets"))
    }

    /// Scrubs `body` delivered in chunks of `sizes` (cycled) and returns the output.
    fn scrub(s: Secrets, body: &[u8], sizes: &[usize]) -> Vec<u8> {
        let mut chunks = Vec::new();
        let mut at = 0;
        let mut i = 0;
        while at < body.len() {
            let n = sizes[i % sizes.len()].max(1).min(body.len() - at);
            chunks.push(Ok::<_, HttpError>(http_body::Frame::data(
                Bytes::copy_from_slice(&body[at..at + n]),
            )));
            at += n;
            i += 1;
        }
        let inner =
            http_body_util::StreamBody::new(futures_util::stream::iter(chunks)).boxed_unsync();
        let out = futures_executor_block_on(s.body(inner).collect());
        out.unwrap_or_else(|e| panic!("{e:?}")).to_bytes().to_vec()
    }

    fn futures_executor_block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap_or_else(|e| panic!("{e}"))
            .block_on(f)
    }

    #[test]
    fn a_secret_split_across_any_chunking_is_masked_and_nothing_else_changes() {
        let token = "s3cr3t-t0ken-do-not-leak";
        let body = format!("authorization: Bearer {token}\nplain text {token}{token} end\nx");
        for size in 1..=body.len() {
            for second in [1, 3, 7] {
                let out = scrub(
                    secrets(&[&format!("Bearer {token}")]),
                    body.as_bytes(),
                    &[size, second],
                );
                let text = String::from_utf8(out).unwrap_or_else(|e| panic!("{e}"));
                assert_eq!(text.len(), body.len(), "length kept");
                assert!(!text.contains(token), "chunks {size}/{second}: {text}");
                assert!(!text.contains("t0ken"), "{text}");
                assert!(
                    text.starts_with("authorization: ****") && text.ends_with(" end\nx"),
                    "{text}"
                );
                assert!(text.contains("plain text ****"), "{text}");
            }
        }
    }

    #[test]
    fn headers_are_masked_and_short_or_plain_values_are_not_secrets() {
        let s = secrets(&["Basic cm9ib3Q6aHVudGVyMg==", "tok"]);
        let mut headers = HeaderMap::new();
        headers.insert(
            "x-echo",
            http::HeaderValue::from_static("Basic cm9ib3Q6aHVudGVyMg=="),
        );
        headers.insert(
            "x-other",
            http::HeaderValue::from_static("tok not-a-secret-value"),
        );
        assert_eq!(s.mask_headers(&mut headers), 1);
        assert_eq!(headers["x-echo"], "**************************");
        assert_eq!(headers["x-other"], "tok not-a-secret-value");
    }
}
