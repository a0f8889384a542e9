//! A loopback "example cloud": the small REST API the Rust template plugin drives.
//! It records every request it receives, so tests can assert what really left the sandbox.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use serde_json::{Value, json};

/// One request as the server saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

#[derive(Default)]
pub struct CloudState {
    pub max_size: u32,
    pub instances: Vec<(String, String)>,
    pub next: u32,
    pub seen: Vec<Seen>,
    /// When set, every request gets this status.
    pub fail_with: Option<u16>,
}

/// A running server; it stops when the test's runtime ends.
#[derive(Clone)]
pub struct ExampleCloud {
    pub addr: SocketAddr,
    pub state: Arc<Mutex<CloudState>>,
}

impl ExampleCloud {
    pub async fn start(max_size: u32) -> ExampleCloud {
        let state = Arc::new(Mutex::new(CloudState {
            max_size,
            ..CloudState::default()
        }));
        let shared = state.clone();
        let addr = crate::serve::serve_http(move |req| handle(shared.clone(), req)).await;
        ExampleCloud { addr, state }
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.state
            .lock()
            .map(|s| s.seen.clone())
            .unwrap_or_default()
    }
}

fn reply(status: StatusCode, body: Value) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body.to_string())));
    *r.status_mut() = status;
    r
}

async fn handle(
    state: Arc<Mutex<CloudState>>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let method = req.method().to_string();
    let path = req.uri().path().to_string();
    let headers = crate::serve::headers(&req);
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let body = String::from_utf8_lossy(&body).into_owned();
    let Ok(mut s) = state.lock() else {
        return Ok(reply(StatusCode::INTERNAL_SERVER_ERROR, json!({})));
    };
    s.seen.push(Seen {
        method: method.clone(),
        path: path.clone(),
        headers,
        body: body.clone(),
    });
    if let Some(code) = s.fail_with {
        let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut r = reply(status, json!({"message": "failing on purpose"}));
        if status == StatusCode::TOO_MANY_REQUESTS {
            r.headers_mut()
                .insert("retry-after", hyper::header::HeaderValue::from_static("7"));
        }
        return Ok(r);
    }
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let response = match (method.as_str(), parts.as_slice()) {
        ("GET", ["v1", "groups", "ci"]) => reply(StatusCode::OK, json!({"max_size": s.max_size})),
        ("GET", ["v1", "groups", "ci", "instances"]) => {
            let list: Vec<Value> = s
                .instances
                .iter()
                .map(|(id, st)| json!({"id": id, "state": st}))
                .collect();
            // A pending instance has booted by the next listing.
            for (_, st) in s.instances.iter_mut().filter(|(_, st)| st == "pending") {
                *st = "running".to_string();
            }
            reply(StatusCode::OK, json!({"instances": list}))
        }
        ("GET", ["v1", "groups", "ci", "instances", id]) => {
            match s.instances.iter().find(|(i, _)| i == id) {
                Some((id, _)) => reply(
                    StatusCode::OK,
                    json!({"id": id, "state": "running", "address": "192.0.2.10"}),
                ),
                None => reply(
                    StatusCode::NOT_FOUND,
                    json!({"message": "no such instance"}),
                ),
            }
        }
        ("POST", ["v1", "groups", "ci", "increase"]) => {
            let delta = serde_json::from_str::<Value>(&body)
                .ok()
                .and_then(|v| v["delta"].as_u64())
                .unwrap_or(0) as u32;
            let room = s.max_size.saturating_sub(s.instances.len() as u32);
            let n = delta.min(room);
            for _ in 0..n {
                s.next += 1;
                let id = format!("i-{}", s.next);
                s.instances.push((id, "pending".to_string()));
            }
            reply(StatusCode::OK, json!({"requested": n}))
        }
        ("POST", ["v1", "groups", "ci", "decrease"]) => {
            let ids: Vec<String> = serde_json::from_str::<Value>(&body)
                .ok()
                .and_then(|v| serde_json::from_value(v["ids"].clone()).ok())
                .unwrap_or_default();
            let accepted: Vec<String> = ids
                .iter()
                .filter(|id| s.instances.iter().any(|(i, _)| i == *id))
                .cloned()
                .collect();
            s.instances.retain(|(i, _)| !accepted.contains(i));
            reply(StatusCode::OK, json!({"accepted": accepted}))
        }
        _ => reply(StatusCode::NOT_FOUND, json!({"message": "no such route"})),
    };
    Ok(response)
}
