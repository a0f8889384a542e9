//! `GET /sd/prometheus`: Prometheus's HTTP service discovery of every pool's machines, so one
//! Prometheus scrapes node_exporter (or any exporter) on the autoscaled machines as they come
//! and go. The answer is the whole list each time, in the `http_sd_configs` format: one target
//! group per instance and exporter port, `[]` when there is none.
//!
//! It has a read-only bearer token of its own (`server.sd_token`), never the lease token: the
//! list tells where the machines are, and nothing here opens a lease, a shell or Docker.
//!
//! Owns: the answer's shape and labels. Must not know: how instances are reached (the
//! connector, or [`Described`] for a pool without one, says what the plugin last described).

mod described;

pub use described::{AbortOnDrop, Described};

use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};

use crate::api::AppState;

/// `http_sd_configs` answers: every target group of every running pool.
pub async fn prometheus(State(state): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    // No token can be right when none is set: the list stays closed, with the setting named.
    let Some(token) = &state.sd_token else {
        return unauthorized(
            "service discovery is off: set server.sd_token (a read-only token of its own)",
        );
    };
    // `Bearer <token>`; Prometheus 2.42's HTTP SD sends a `credentials_file` bare unless the
    // config says `type: Bearer`, so the bare token is taken too: either way it is the secret.
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.strip_prefix("Bearer ").unwrap_or(v))
        .unwrap_or("");
    if !token.matches(given.as_bytes()) {
        return unauthorized("missing or invalid bearer token (server.sd_token)");
    }
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        Value::Array(groups(&state)).to_string(),
    )
        .into_response()
}

/// Every target group of every running pool, in the format both `http_sd_configs` and
/// `file_sd_configs` read.
pub fn groups(state: &AppState) -> Vec<Value> {
    let mut groups = Vec::new();
    for (name, pool) in state.pools.running_pools() {
        let views = pool.handle.with_core(|c| c.instances());
        for view in views {
            let (described, address) = match &pool.connector {
                Some(c) => c
                    .described(&view.id)
                    .map_or((None, None), |(d, a)| (Some(d), a)),
                None => {
                    let d = pool.described.get(&view.id);
                    let a = d
                        .as_ref()
                        .and_then(|d| d.internal_address.clone().or(d.external_address.clone()));
                    (d, a)
                }
            };
            let mut labels = Map::new();
            let mut label = |key: &str, value: String| {
                labels.insert(format!("__meta_flotilla_{key}"), Value::String(value));
            };
            label("pool", name.clone());
            label("plugin", pool.plugin.clone());
            label("group", pool.group.clone());
            label("instance_id", view.id.clone());
            label("state", state_name(&view));
            label("use_count", view.use_count.to_string());
            if let Some(tenant) = &view.tenant {
                label("tenant", tenant.clone());
            }
            if let Some(d) = &described {
                label("os", serde_name(&d.os));
                label("arch", serde_name(&d.arch));
                if let Some(a) = &d.internal_address {
                    label("internal_address", a.clone());
                }
                if let Some(a) = &d.external_address {
                    label("external_address", a.clone());
                }
                let mut addresses: Vec<&str> = Vec::new();
                for a in [&d.internal_address, &d.external_address]
                    .into_iter()
                    .flatten()
                {
                    if !addresses.contains(&a.as_str()) {
                        addresses.push(a);
                    }
                }
                if !addresses.is_empty() {
                    label("addresses", addresses.join(","));
                }
                // A plugin of a contract before 0.1.4, or a cloud without zones, reports none:
                // the label is left out rather than set empty.
                if let Some(zone) = &d.zone {
                    label("zone", zone.clone());
                }
            }
            for port in &pool.exporter_ports {
                let mut labels = labels.clone();
                labels.insert(
                    "__meta_flotilla_exporter_port".into(),
                    Value::String(port.to_string()),
                );
                // An instance not described yet (still being created) is listed without a
                // target, so its labels are there for dashboards.
                let targets: Vec<String> = address.iter().map(|a| host_port(a, *port)).collect();
                groups.push(json!({ "targets": targets, "labels": labels }));
            }
        }
    }
    groups
}

/// How often the `file_sd` file is brought up to date (Prometheus watches it, and rereads
/// it every `refresh_interval` too).
const FILE_SD_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// Keeps `path` holding the machine list, written whole (a temporary file renamed over it, so
/// Prometheus never reads half a list) whenever it changed. A failed write is logged and
/// tried again at the next round.
pub async fn write_file_sd(state: Arc<AppState>, path: std::path::PathBuf) {
    let mut last: Option<String> = None;
    loop {
        let text = Value::Array(groups(&state)).to_string();
        if last.as_ref() != Some(&text) {
            match write_whole(&path, &text) {
                Ok(()) => last = Some(text),
                Err(e) => {
                    tracing::warn!(file_sd = %path.display(), "cannot write the machine list: {e}")
                }
            }
        }
        tokio::time::sleep(FILE_SD_EVERY).await;
    }
}

fn write_whole(path: &std::path::Path, text: &str) -> std::io::Result<()> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.tmp"));
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

/// The instance's state as the instances API writes it (`ready`, `creating`, ...).
fn state_name(view: &flotilla_scaler::core::InstanceView) -> String {
    serde_name(&view.state)
}

/// A unit enum's name as the API writes it.
fn serde_name(value: &impl serde::Serialize) -> String {
    match serde_json::to_value(value) {
        Ok(Value::String(s)) => s,
        other => format!("{other:?}"),
    }
}

/// `host:port`, with an IPv6 address in brackets.
fn host_port(address: &str, port: u16) -> String {
    if address.contains(':') && !address.starts_with('[') {
        format!("[{address}]:{port}")
    } else {
        format!("{address}:{port}")
    }
}

/// A refusal in the API's shape: 401 `unauthorized`, with why.
fn unauthorized(message: &str) -> Response {
    crate::api::ApiError::new(flotilla_api::ErrorCode::Unauthorized, message).into_response()
}

#[cfg(test)]
mod tests {
    use super::host_port;

    #[test]
    fn an_ipv6_address_is_bracketed() {
        assert_eq!(host_port("10.0.0.5", 9100), "10.0.0.5:9100");
        assert_eq!(host_port("fd00::5", 9100), "[fd00::5]:9100");
        assert_eq!(host_port("node-1.internal", 9182), "node-1.internal:9182");
    }
}
