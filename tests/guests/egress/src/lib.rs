//! A test guest that makes whatever outbound HTTP requests the test asks for, to attack the
//! egress policy from the inside.
//!
//! `connect-info(id)` takes a JSON command as `id`:
//! `{"url": "...", "credential": "name", "service": "ec2", "count": N, "method": "POST",
//!   "body": "...", "hold": true, "capture": true}` and reports, through the test-only `flotilla:test/probe` import under the
//! key `report`:
//! `{"results": [{"status": 200, "bytes": 12} | {"error": "..."}], "sent_headers": [[k, v]...]}`.
//! `sent_headers` is the guest's own view of the request it built. `hold` keeps each response
//! unread in the guest's state (across calls); `capture` adds the response's `headers` and
//! `body` (as text) to its result. `"write_first": N` sends N bytes of body the way a plain
//! wasi:http guest can: the whole body written (4 KiB at a time, each write waiting for room)
//! after `handle` and before it waits for the response; its result is `status` and `body`.
//! The setting `{"on_update": <command>}` makes every `update` run that command too.
#![allow(unsafe_code)] // wit-bindgen's generated export glue is unsafe; this crate's own code is not
#![allow(missing_docs)] // a component's API is its WIT; the generated bindings carry no docs

use serde_json::{Value, json};
use wstd::http::{Body, BodyExt, Client, Request};

wit_bindgen::generate!({
    path: "../../../wit",
    world: "flotilla:provider/provider",
    generate_all,
});

mod probe {
    wit_bindgen::generate!({
        path: "../../wit/probe.wit",
        world: "flotilla:test/reporter",
    });
    pub use self::flotilla::test::probe::report;
}

use exports::flotilla::provider::instance_group::Guest;
use flotilla::provider::types::{
    Arch, Capabilities, Connection, Error, Instance, Os, Protocol, ProviderInfo,
};

async fn one(cmd: &Value, sent: &mut Vec<Value>) -> Value {
    if let Some(n) = cmd["write_first"].as_u64() {
        return write_first(cmd, n).unwrap_or_else(|e| json!({ "error": e }));
    }
    let url = cmd["url"].as_str().unwrap_or_default();
    let method = cmd["method"].as_str().unwrap_or("GET");
    let mut builder = Request::builder().method(method).uri(url);
    if let Some(c) = cmd["credential"].as_str() {
        builder = builder.header("flotilla-credential", c);
    }
    if let Some(s) = cmd["service"].as_str() {
        builder = builder.header("flotilla-aws-service", s);
    }
    let body = match cmd["body"].as_str() {
        Some(b) => Body::from(b.as_bytes().to_vec()),
        None => Body::from_stream(futures_lite::stream::empty::<Vec<u8>>()),
    };
    let request = match builder.body(body) {
        Ok(r) => r,
        Err(e) => return json!({"error": format!("build: {e}")}),
    };
    if sent.is_empty() {
        for (k, v) in request.headers() {
            sent.push(json!([k.as_str(), String::from_utf8_lossy(v.as_bytes())]));
        }
    }
    let response = match Client::new().send(request).await {
        Ok(r) => r,
        Err(e) => return json!({"error": format!("{e:?}")}),
    };
    let status = response.status().as_u16();
    if cmd["hold"].as_bool() == Some(true) {
        // Keep the response (and its connection) without reading it, across calls.
        HELD.with(|h| h.borrow_mut().push(response));
        return json!({"status": status, "held": true});
    }
    let headers: Vec<Value> = response
        .headers()
        .iter()
        .map(|(k, v)| json!([k.as_str(), String::from_utf8_lossy(v.as_bytes())]))
        .collect();
    let mut body = response.into_body().into_boxed_body();
    let mut bytes = 0u64;
    let mut text = Vec::new();
    let capture = cmd["capture"].as_bool() == Some(true);
    loop {
        match body.frame().await {
            None => break,
            Some(Ok(frame)) => {
                if let Some(d) = frame.data_ref() {
                    bytes += d.len() as u64;
                    if capture {
                        text.extend_from_slice(d);
                    }
                }
            }
            Some(Err(e)) => {
                return json!({"status": status, "bytes": bytes, "error": format!("{e:?}")});
            }
        }
    }
    if capture {
        return json!({"status": status, "bytes": bytes, "headers": headers,
            "body": String::from_utf8_lossy(&text)});
    }
    json!({"status": status, "bytes": bytes})
}

/// A POST of `n` bytes through wasi:http directly: `handle`, then the whole body, then the wait
/// for the response. Nothing here waits on the response while the body goes out, so the host
/// must move the request along on its own.
fn write_first(cmd: &Value, n: u64) -> Result<Value, String> {
    use wasip2::http::outgoing_handler::handle;
    use wasip2::http::types::{Fields, Method, OutgoingBody, OutgoingRequest, Scheme};
    use wasip2::io::streams::StreamError;

    let url = cmd["url"].as_str().unwrap_or_default();
    let rest = url.strip_prefix("http://").ok_or("http URLs only")?;
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let mut headers = Vec::new();
    if let Some(c) = cmd["credential"].as_str() {
        headers.push(("flotilla-credential".to_string(), c.as_bytes().to_vec()));
    }
    let fields = Fields::from_list(&headers).map_err(|e| format!("{e:?}"))?;
    let request = OutgoingRequest::new(fields);
    let set = [
        request.set_method(&Method::Post),
        request.set_scheme(Some(&Scheme::Http)),
        request.set_authority(Some(authority)),
        request.set_path_with_query(Some(path)),
    ];
    if set.iter().any(Result::is_err) {
        return Err("cannot set the request's parts".into());
    }
    let body = request.body().map_err(|()| "no body")?;
    let response = handle(request, None).map_err(|e| format!("{e:?}"))?;
    {
        let out = body.write().map_err(|()| "no body stream")?;
        let mut left = n;
        while left > 0 {
            let len = left.min(4096);
            out.blocking_write_and_flush(&vec![b'x'; len as usize])
                .map_err(|e| format!("write: {e:?}"))?;
            left -= len;
        }
    }
    OutgoingBody::finish(body, None).map_err(|e| format!("finish: {e:?}"))?;
    response.subscribe().block();
    let response = match response.get() {
        Some(Ok(Ok(r))) => r,
        Some(Ok(Err(e))) => return Err(format!("{e:?}")),
        other => return Err(format!("no response: {}", other.is_some())),
    };
    let status = response.status();
    let body = response.consume().map_err(|()| "no response body")?;
    let stream = body.stream().map_err(|()| "no response stream")?;
    let mut text = Vec::new();
    loop {
        match stream.blocking_read(4096) {
            Ok(chunk) => text.extend_from_slice(&chunk),
            Err(StreamError::Closed) => break,
            Err(e) => return Err(format!("read: {e:?}")),
        }
    }
    Ok(json!({"status": status, "body": String::from_utf8_lossy(&text)}))
}

thread_local! {
    /// The command `update` runs, from the `on_update` setting (for tests that run the guest
    /// as a pool, where nothing calls `connect-info` with commands).
    static ON_UPDATE: std::cell::RefCell<Option<Value>> = const { std::cell::RefCell::new(None) };
    /// Responses kept unread by `"hold": true` commands, across calls.
    static HELD: std::cell::RefCell<Vec<wstd::http::Response<Body>>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

struct Egress;

impl Guest for Egress {
    fn init(settings: String) -> Result<ProviderInfo, Error> {
        let settings: Value = serde_json::from_str(&settings).unwrap_or(Value::Null);
        ON_UPDATE.with(|c| *c.borrow_mut() = settings.get("on_update").cloned());
        Ok(ProviderInfo {
            id: "test/egress".into(),
            version: "0".into(),
            max_size: 0,
            capabilities: Capabilities {
                heartbeat: false,
                expiring_connect_info: false,
            },
        })
    }
    fn update() -> Result<Vec<Instance>, Error> {
        if let Some(cmd) = ON_UPDATE.with(|c| c.borrow().clone()) {
            let count = cmd.get("count").and_then(Value::as_u64).unwrap_or(1);
            wstd::runtime::block_on(async {
                let mut sent = Vec::new();
                for _ in 0..count {
                    one(&cmd, &mut sent).await;
                }
            });
        }
        Ok(Vec::new())
    }
    fn increase(_delta: u32) -> Result<u32, Error> {
        Ok(0)
    }
    fn decrease(_ids: Vec<String>) -> Result<Vec<String>, Error> {
        Ok(Vec::new())
    }
    fn connect_info(id: String) -> Result<Connection, Error> {
        let cmd: Value =
            serde_json::from_str(&id).map_err(|e| Error::InvalidConfig(e.to_string()))?;
        let count = cmd.get("count").and_then(Value::as_u64).unwrap_or(1);
        let report = wstd::runtime::block_on(async {
            let mut sent = Vec::new();
            let mut results = Vec::new();
            for _ in 0..count {
                results.push(one(&cmd, &mut sent).await);
            }
            json!({"results": results, "sent_headers": sent})
        });
        probe::report("report", &report.to_string());
        Ok(Connection {
            id,
            os: Os::Linux,
            arch: Arch::Amd64,
            protocol: Protocol::Ssh,
            internal_address: None,
            external_address: None,
            port: 0,
            username: "probe".to_string(),
            expires: None,
            zone: None,
        })
    }
    fn heartbeat(_id: String) -> Result<(), Error> {
        Ok(())
    }
    fn shutdown() -> Result<(), Error> {
        Ok(())
    }
}

export!(Egress);
