//! Registry failures in the user's words: each becomes one [`OciError`] line that says what
//! to do (log in, list an insecure registry, trust a CA).

use oci_client::errors::OciDistributionError;

use crate::http::describe_reqwest;
use crate::{OciError, OciRef};

use super::Registry;

fn op_name(push: bool) -> &'static str {
    if push { "push" } else { "pull" }
}

/// What a failed request was about, for the error it becomes.
struct Target<'a> {
    r: &'a OciRef,
    push: bool,
}

impl Target<'_> {
    /// The error for an HTTP status: 401 means log in, 403 means the account lacks the right,
    /// 404 means no such artifact, and anything else is the registry's own words.
    fn by_status(&self, code: u16, why: String) -> OciError {
        let registry = self.r.registry.clone();
        let reference = self.r.to_string();
        match code {
            401 => OciError::Unauthorized {
                registry,
                reference,
            },
            403 => OciError::Forbidden {
                registry,
                operation: op_name(self.push),
                reference,
            },
            404 => OciError::NotFound { reference },
            _ => OciError::Registry {
                registry,
                reference,
                why,
            },
        }
    }

    fn request(&self, e: &reqwest::Error) -> OciError {
        if let Some(status) = e.status() {
            self.by_status(status.as_u16(), describe_reqwest(e))
        } else if e.is_connect() || e.is_timeout() || e.is_request() {
            OciError::Unreachable {
                registry: self.r.registry.clone(),
                why: describe_reqwest(e),
            }
        } else {
            self.by_status(0, describe_reqwest(e))
        }
    }

    /// The registry's error envelope, classified by its codes.
    fn envelope(&self, envelope: &oci_client::errors::OciEnvelope) -> OciError {
        use oci_client::errors::OciErrorCode as Code;
        let why = envelope
            .errors
            .iter()
            .map(|e| e.message.clone())
            .collect::<Vec<_>>()
            .join("; ");
        let has = |f: fn(&Code) -> bool| envelope.errors.iter().any(|e| f(&e.code));
        if has(|c| matches!(c, Code::Unauthorized)) {
            self.by_status(401, why)
        } else if has(|c| matches!(c, Code::Denied)) {
            self.by_status(403, why)
        } else if has(|c| {
            matches!(
                c,
                Code::BlobUnknown
                    | Code::BlobUploadUnknown
                    | Code::ManifestBlobUnknown
                    | Code::ManifestUnknown
                    | Code::NameUnknown
            )
        }) {
            self.by_status(404, why)
        } else {
            self.by_status(0, why)
        }
    }
}

impl Registry {
    pub(super) fn map_err(&self, r: &OciRef, push: bool, e: OciDistributionError) -> OciError {
        let t = Target { r, push };
        match e {
            OciDistributionError::RequestError(e) => t.request(&e),
            OciDistributionError::UnauthorizedError { .. } => t.by_status(401, String::new()),
            // oci-client reports a refused token request only as text; its status is in it.
            OciDistributionError::AuthenticationFailure(msg) if msg.contains("403") => {
                t.by_status(403, msg)
            }
            OciDistributionError::AuthenticationFailure(msg) => t.by_status(401, msg),
            OciDistributionError::ImageManifestNotFoundError(_) => t.by_status(404, String::new()),
            OciDistributionError::DigestError(
                oci_client::errors::DigestError::VerificationError { expected, actual },
            ) => OciError::DigestMismatch {
                what: "manifest",
                reference: r.to_string(),
                expected,
                actual,
            },
            OciDistributionError::ServerError { code, message, .. } => {
                t.by_status(code, format!("HTTP {code}: {}", one_line(&message)))
            }
            OciDistributionError::RegistryError { envelope, .. } => t.envelope(&envelope),
            other => t.by_status(0, one_line(&other.to_string())),
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
