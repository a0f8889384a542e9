//! Registry failures in the user's words: each becomes one [`OciError`] line that says what
//! to do (log in, list an insecure registry, trust a CA).

use oci_client::errors::OciDistributionError;

use crate::http::describe_reqwest;
use crate::{OciError, OciRef};

use super::Registry;

fn op_name(push: bool) -> &'static str {
    if push { "push" } else { "pull" }
}

impl Registry {
    pub(super) fn map_err(&self, r: &OciRef, push: bool, e: OciDistributionError) -> OciError {
        let registry = r.registry.clone();
        let reference = r.to_string();
        let by_status = |code: u16, why: String| match code {
            401 => OciError::Unauthorized {
                registry: registry.clone(),
                reference: reference.clone(),
            },
            403 => OciError::Forbidden {
                registry: registry.clone(),
                operation: op_name(push),
                reference: reference.clone(),
            },
            404 => OciError::NotFound {
                reference: reference.clone(),
            },
            _ => OciError::Registry {
                registry: registry.clone(),
                reference: reference.clone(),
                why,
            },
        };
        match e {
            OciDistributionError::RequestError(e) => {
                if let Some(status) = e.status() {
                    by_status(status.as_u16(), describe_reqwest(&e))
                } else if e.is_connect() || e.is_timeout() || e.is_request() {
                    OciError::Unreachable {
                        registry,
                        why: describe_reqwest(&e),
                    }
                } else {
                    OciError::Registry {
                        registry,
                        reference,
                        why: describe_reqwest(&e),
                    }
                }
            }
            OciDistributionError::UnauthorizedError { .. } => by_status(401, String::new()),
            OciDistributionError::AuthenticationFailure(msg) => {
                if msg.contains("403") {
                    by_status(403, msg)
                } else {
                    by_status(401, msg)
                }
            }
            OciDistributionError::ImageManifestNotFoundError(_) => by_status(404, String::new()),
            OciDistributionError::DigestError(
                oci_client::errors::DigestError::VerificationError { expected, actual },
            ) => OciError::DigestMismatch {
                what: "manifest",
                reference,
                expected,
                actual,
            },
            OciDistributionError::ServerError { code, message, .. } => {
                by_status(code, format!("HTTP {code}: {}", one_line(&message)))
            }
            OciDistributionError::RegistryError { envelope, .. } => {
                let codes: Vec<String> = envelope
                    .errors
                    .iter()
                    .map(|e| format!("{:?}", e.code).to_ascii_uppercase())
                    .collect();
                let why = envelope
                    .errors
                    .iter()
                    .map(|e| e.message.clone())
                    .collect::<Vec<_>>()
                    .join("; ");
                if codes.iter().any(|c| c == "UNAUTHORIZED") {
                    by_status(401, why)
                } else if codes.iter().any(|c| c == "DENIED") {
                    by_status(403, why)
                } else if codes
                    .iter()
                    .any(|c| c.ends_with("UNKNOWN") && c != "UNKNOWN")
                {
                    by_status(404, why)
                } else {
                    by_status(0, why)
                }
            }
            other => OciError::Registry {
                registry,
                reference,
                why: one_line(&other.to_string()),
            },
        }
    }
}

fn one_line(s: &str) -> String {
    let s = s.split_whitespace().collect::<Vec<_>>().join(" ");
    if s.chars().count() > 300 {
        s.chars().take(300).collect::<String>() + "…"
    } else {
        s
    }
}
