//! cosign-compatible key-pair signatures: the simple-signing payload, stored under the
//! `sha256-<digest>.sig` tag so it works on registries without the referrers API.

use base64::Engine as _;
use serde_json::{Value, json};

use super::keys::PublicKey;

/// Layer media type of a cosign signature payload.
pub(crate) const SIMPLESIGNING_MEDIA_TYPE: &str =
    "application/vnd.dev.cosign.simplesigning.v1+json";
/// Annotation carrying the base64 signature.
pub(crate) const SIGNATURE_ANNOTATION: &str = "dev.cosignproject.cosign/signature";
/// Config media type cosign uses for signature manifests.
pub(crate) const SIGNATURE_CONFIG_MEDIA_TYPE: &str = "application/vnd.oci.image.config.v1+json";
const PAYLOAD_TYPE: &str = "cosign container image signature";

/// The simple-signing payload cosign signs for an image digest.
pub(crate) fn payload(repo_name: &str, digest: &str) -> Vec<u8> {
    json!({
        "critical": {
            "identity": { "docker-reference": repo_name },
            "image": { "docker-manifest-digest": digest },
            "type": PAYLOAD_TYPE,
        },
        "optional": null,
    })
    .to_string()
    .into_bytes()
}

/// A signature manifest under `sha256-<hex>.sig`, as cosign writes it: an image manifest whose
/// layers are simple-signing payloads, each with its signature in an annotation.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct SignatureManifest {
    pub schema_version: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<Descriptor>,
    #[serde(default)]
    pub layers: Vec<Descriptor>,
}

/// An OCI descriptor; keys this type does not name are kept as they were (`extra`), so
/// rewriting a manifest does not drop what another tool put there.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Descriptor {
    #[serde(default)]
    pub media_type: String,
    pub digest: String,
    #[serde(default)]
    pub size: u64,
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub annotations: std::collections::BTreeMap<String, String>,
    #[serde(flatten)]
    pub extra: serde_json::Map<String, Value>,
}

impl Descriptor {
    /// The cosign signature this layer carries, if it is a simple-signing layer.
    pub fn signature(&self) -> Option<&str> {
        (self.media_type == SIMPLESIGNING_MEDIA_TYPE)
            .then(|| {
                self.annotations
                    .get(SIGNATURE_ANNOTATION)
                    .map(String::as_str)
            })
            .flatten()
    }
}

/// A signature layer as found in a `.sig` manifest (payload fetched and digest-verified).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct SignatureLayer {
    pub payload_b64: String,
    pub signature: String,
}

/// The result of checking the signatures found for a digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SignatureCheck {
    /// At least one signature verified with the key and names this digest.
    Verified,
    /// Why none did.
    Failed(String),
}

/// Checks `layers` against `key` for `digest` pulled from `repository` (`registry/name`): at
/// least one must verify, name the digest, and name the repository (`docker-reference`), so a
/// signature made for one artifact cannot vouch for another signed with the same key (an old,
/// vulnerable plugin copied under a new name).
pub(crate) fn check(
    key: &PublicKey,
    digest: &str,
    repository: &str,
    layers: &[SignatureLayer],
) -> SignatureCheck {
    if layers.is_empty() {
        return SignatureCheck::Failed("the artifact is not signed".to_string());
    }
    let mut reasons = Vec::new();
    for layer in layers {
        let Ok(payload) = base64::engine::general_purpose::STANDARD.decode(&layer.payload_b64)
        else {
            reasons.push("a signature payload is not base64".to_string());
            continue;
        };
        if !key.verifies(&payload, &layer.signature) {
            reasons.push("a signature does not verify with the configured key".to_string());
            continue;
        }
        let v: Value = match serde_json::from_slice(&payload) {
            Ok(v) => v,
            Err(_) => {
                reasons.push("a signed payload is not JSON".to_string());
                continue;
            }
        };
        let signed = v
            .pointer("/critical/image/docker-manifest-digest")
            .and_then(Value::as_str);
        let kind = v.pointer("/critical/type").and_then(Value::as_str);
        let named = v
            .pointer("/critical/identity/docker-reference")
            .and_then(Value::as_str);
        if kind != Some(PAYLOAD_TYPE) {
            reasons.push("a signed payload has the wrong type".to_string());
        } else if signed != Some(digest) {
            reasons.push(format!(
                "a valid signature covers {}, not {digest}",
                signed.unwrap_or("nothing")
            ));
        } else if named.map(same_repository) != Some(same_repository(repository)) {
            reasons.push(format!(
                "a valid signature names {}, not {repository}",
                named.unwrap_or("no repository")
            ));
        } else {
            return SignatureCheck::Verified;
        }
    }
    reasons.dedup();
    SignatureCheck::Failed(reasons.join("; "))
}

/// A repository name as signatures are compared: Docker Hub's aliases as `docker.io`, the
/// registry in lower case, and a tag or digest after the name dropped (cosign signs the
/// repository; some tools add the tag).
fn same_repository(name: &str) -> String {
    let name = name.split_once('@').map_or(name, |(n, _)| n);
    let (registry, path) = name.split_once('/').unwrap_or((name, ""));
    let path = match path.rsplit_once('/') {
        Some((dir, last)) => format!("{dir}/{}", last.split(':').next().unwrap_or(last)),
        None => path.split(':').next().unwrap_or(path).to_string(),
    };
    let registry = registry.to_ascii_lowercase();
    let registry = match registry.as_str() {
        "index.docker.io" | "registry-1.docker.io" | "registry.hub.docker.com" => "docker.io",
        other => other,
    };
    format!("{registry}/{path}")
}

/// The config blob of a signature manifest (the shape cosign writes).
pub(crate) fn signature_config(payload_digests: &[String]) -> Vec<u8> {
    json!({
        "architecture": "",
        "created": "0001-01-01T00:00:00Z",
        "history": [{ "created": "0001-01-01T00:00:00Z" }],
        "os": "",
        "rootfs": { "type": "layers", "diff_ids": payload_digests },
        "config": {},
    })
    .to_string()
    .into_bytes()
}

/// The `.sig` tag for a digest.
pub(crate) fn signature_tag(digest: &str) -> String {
    digest.replacen(':', "-", 1) + ".sig"
}
