//! Object stores for GitLab Runner's distributed cache (`[runners.cache]`), and the runner
//! host's side of reaching them: what the runner bakes into each stage's script so that the
//! helper container on a CI machine can PUT, GET and HEAD a cache archive. A test saves a cache
//! through one of these on machine A and restores it on machine B.
//!
//! - [`S3Store`] (`s3`): moto's server; SigV4 presigned GET, HEAD and PUT URLs as the runner's
//!   `cache/s3v2` adapter makes them.
//! - [`GcsStore`] (`gcs`): a stand-in for the GCS XML API over HTTPS; V2 signed URLs as the
//!   runner's `cache/gcsv2` adapter makes them (the storage library's default scheme). No
//!   emulator serves those: see that module.
//! - [`AzureStore`] (`azure`): Azurite over HTTPS; a GoCloud `azblob://` URL plus a blob SAS
//!   token as the runner's `cache/azure` adapter makes them.
//!
//! Each is started on a given address (tests pass [`crate::netaddr::PEER_IP`], which Docker
//! containers reach) and stopped when dropped. Facts about the runner cite
//! `github:gitlabhq/gitlab-runner` (19.4.0) paths; `shared/design/GITLAB-RUNNER-FACTS.md`
//! section 3 has the overview.
//!
//! Owns: starting the stores, signing access to one object, reading what a store holds.
//! Must not know: any Flotilla crate, or the helper that uses the access.

mod azure;
mod gcs;
mod s3;

use std::io::{BufRead, Read};
use std::net::IpAddr;
use std::time::Duration;

pub use azure::AzureStore;
pub use gcs::GcsStore;
pub use s3::S3Store;

/// What the runner host hands the helper for one object and one direction, as
/// `shells/abstract.go` `getCacheUploadURLAndEnv` / `getCacheDownloadURLAndEnv` turn an adapter's
/// answer into `cache-archiver` / `cache-extractor` flags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Access {
    /// `--url <url>` plus, on upload, one `--header 'K: V'` per header and `--check-url
    /// <head_url>`; on download `--head-url <head_url>` (`cache.PresignedURL`).
    Presigned {
        url: String,
        head_url: Option<String>,
        headers: Vec<(String, String)>,
    },
    /// `--gocloud-url <url>` plus an env file holding `env` (`cache.GoCloudURL`).
    GoCloud {
        url: String,
        env: Vec<(String, String)>,
    },
}

impl Access {
    /// The value of `name` in a GoCloud access's env, if any.
    pub fn env(&self, name: &str) -> Option<&str> {
        match self {
            Access::GoCloud { env, .. } => {
                env.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
            }
            Access::Presigned { .. } => None,
        }
    }
}

/// How long signed access lives: the runner signs for the job's timeout
/// (`build.GetBuildTimeout()` passed to `cache.GetAdapter`), which falls back to
/// `DefaultTimeout`, 7200 s (`common/consts.go`), when the job carries none.
pub const JOB_TIMEOUT: Duration = Duration::from_secs(7200);

/// The human cache key the runner stores as `cachekey` metadata on upload
/// (`shells/abstract.go` `addCacheUploadCommand`): the object name is
/// `[<path>/][runner/<token>/]project/<id>/<key>` (`cache/cache.go` `GetAdapter`), so the key is
/// what follows `project/<id>/`; any other name is taken whole.
pub fn human_key(object: &str) -> &str {
    let Some(at) = object.find("project/") else {
        return object;
    };
    object
        .get(at + "project/".len()..)
        .and_then(|rest| rest.split_once('/'))
        .map_or(object, |(_, key)| key)
}

/// Percent-encodes a path of `/`-separated segments, keeping the slashes: RFC 3986 unreserved
/// characters stay, everything else is `%XX` (the encoding both S3 and GCS canonicalise).
pub fn encode_path(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for byte in path.bytes() {
        if byte.is_ascii_alphanumeric() || b"-_.~/".contains(&byte) {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// `ip` as the host part of a URL (an IPv6 address in brackets).
pub fn url_host(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => format!("[{v6}]"),
    }
}

/// A CA and a server certificate for `ip` (PEM), for a store that must be reached over HTTPS.
pub(crate) struct TlsFiles {
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
    /// The server certificate as DER, for a rustls server.
    pub cert_der: Vec<u8>,
    /// The same key as PKCS#8 DER, for a rustls server.
    pub key_der: Vec<u8>,
}

impl TlsFiles {
    pub fn for_ip(ip: IpAddr) -> TlsFiles {
        let ca_key = rcgen::KeyPair::generate().expect("a CA key");
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "flotilla test cache-store CA");
        let ca = ca_params.self_signed(&ca_key).expect("a CA certificate");
        let issuer = rcgen::Issuer::new(ca_params, ca_key);
        let key = rcgen::KeyPair::generate().expect("a key");
        let cert = rcgen::CertificateParams::new(vec![ip.to_string()])
            .expect("params")
            .signed_by(&key, &issuer)
            .expect("a certificate");
        TlsFiles {
            ca_pem: ca.pem(),
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            cert_der: cert.der().to_vec(),
            key_der: key.serialize_der(),
        }
    }
}

/// Reads `stream` (a daemon's stdout or stderr) on a thread until a line contains `marker`
/// followed by a port, and returns that port; the rest is drained so the daemon never blocks on
/// a full pipe. `None` when the stream ends or `limit` passes first.
pub(crate) fn announced_port(
    stream: impl Read + Send + 'static,
    marker: String,
    limit: Duration,
) -> Option<u16> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut tx = Some(tx);
        for line in std::io::BufReader::new(stream).lines() {
            let Ok(line) = line else { break };
            let port = line.split(marker.as_str()).nth(1).and_then(|rest| {
                let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
                digits.parse::<u16>().ok()
            });
            if let (Some(port), Some(sender)) = (port, tx.as_ref()) {
                let _ = sender.send(port); // the starter may have given up waiting
                tx = None;
            }
        }
    });
    rx.recv_timeout(limit).ok()
}

/// Runs `curl` with `args` (silent, status written last) and returns the HTTP status and the
/// body; status 0 when curl could not connect.
pub(crate) fn curl(args: &[&str]) -> (u16, Vec<u8>) {
    let out = std::process::Command::new("curl")
        .args(["-sS", "--max-time", "20", "-w", "\n%{http_code}"])
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("curl: {e}"));
    let mut body = out.stdout;
    let split = body.iter().rposition(|b| *b == b'\n').unwrap_or(0);
    let status = String::from_utf8_lossy(&body[split..])
        .trim()
        .parse()
        .unwrap_or(0);
    body.truncate(split);
    (status, body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_human_key_is_what_follows_the_project_id() {
        assert_eq!(human_key("runner/abc/project/10/key"), "key");
        assert_eq!(human_key("project/10/build/main"), "build/main");
        assert_eq!(human_key("loose"), "loose");
    }

    #[test]
    fn paths_keep_their_slashes_and_escape_the_rest() {
        assert_eq!(encode_path("a b/c+d~e"), "a%20b/c%2Bd~e");
    }
}
