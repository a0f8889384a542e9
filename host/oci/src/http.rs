//! What the registry client and the login probe share about HTTP: the connect timeout, and
//! one-line descriptions of transport failures.

use std::time::Duration;

/// Connect timeout for registry requests (the overall timeout is configurable).
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Describes a reqwest failure with its cause chain (DNS, refused, timeout) in one line.
pub(crate) fn describe_reqwest(e: &reqwest::Error) -> String {
    let mut parts = Vec::new();
    if e.is_timeout() {
        parts.push("timed out".to_string());
    } else if e.is_connect() {
        parts.push("connection failed".to_string());
    }
    let mut source: Option<&dyn std::error::Error> = std::error::Error::source(e);
    let mut last = String::new();
    while let Some(s) = source {
        last = s.to_string();
        source = s.source();
    }
    if last.contains("InvalidContentType") || last.contains("corrupt message") {
        last = "the registry does not answer TLS (a plain-HTTP registry? then list it as insecure)"
            .to_string();
    }
    if last.contains("certificate") {
        last.push_str(" (trust a private CA with --ca-file or [oci] tls_ca_files)");
    }
    if !last.is_empty() {
        parts.push(last);
    }
    if parts.is_empty() {
        parts.push(e.to_string());
    }
    parts.join(": ")
}
