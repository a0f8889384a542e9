//! The CNCF Wasm OCI artifact: building one for `push` and checking one before anything from
//! it is cached or compiled.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::{Value, json};

use super::OciError;
use super::reference::valid_digest;
use super::surface;

// The CNCF TAG Runtime's "Wasm OCI Artifact layout" (tag-runtime/wasm/oci-artifact):
/// OCI image manifest media type.
pub(crate) const MANIFEST_MEDIA_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
/// CNCF Wasm config media type (not oci-client's older `WASM_CONFIG_MEDIA_TYPE`).
pub(crate) const CONFIG_MEDIA_TYPE: &str = "application/vnd.wasm.config.v0+json";
/// CNCF Wasm layer media type.
pub(crate) const LAYER_MEDIA_TYPE: &str = "application/wasm";
/// The config's `architecture` for every Wasm artifact.
const WASM_ARCHITECTURE: &str = "wasm";
/// The config's `os` for a component (a core module would say `wasip1`).
const COMPONENT_OS: &str = "wasip2";
/// Largest manifest accepted.
pub(crate) const MAX_MANIFEST: u64 = 4 << 20;
/// Largest config blob accepted.
pub(crate) const MAX_CONFIG: u64 = 1 << 20;
/// Largest wasm layer accepted (Python and JS plugins are ~20 MB).
pub(crate) const MAX_LAYER: u64 = 256 << 20;

/// Manifest annotations for `push`: defaults filled in, `--annotation` wins.
#[derive(Debug, Clone, Default)]
pub struct PushAnnotations(pub BTreeMap<String, String>);

const OCI_PREFIX: &str = "org.opencontainers.image.";

impl PushAnnotations {
    /// Parses `k=v` pairs; short keys (`version`) mean `org.opencontainers.image.version`.
    pub fn parse(pairs: &[String]) -> Result<Self, String> {
        let mut map = BTreeMap::new();
        let mut errors = Vec::new();
        for pair in pairs {
            match pair.split_once('=') {
                Some((k, v)) if !k.trim().is_empty() => {
                    let k = k.trim();
                    let key = if k.contains('.') {
                        k.to_string()
                    } else {
                        format!("{OCI_PREFIX}{k}")
                    };
                    map.insert(key, v.to_string());
                }
                _ => errors.push(format!("--annotation {pair:?}: expected KEY=VALUE")),
            }
        }
        if errors.is_empty() {
            Ok(PushAnnotations(map))
        } else {
            Err(errors.join("; "))
        }
    }

    /// Adds the standard annotations the user did not set.
    pub(crate) fn with_defaults(mut self, title: &str, tag: Option<&str>, created: &str) -> Self {
        let mut set = |k: &str, v: String| {
            self.0.entry(format!("{OCI_PREFIX}{k}")).or_insert(v);
        };
        set("title", title.to_string());
        set("created", created.to_string());
        if let Some(tag) = tag {
            set("version", tag.to_string());
        }
        self
    }
}

/// A built artifact, ready to upload.
pub(crate) struct Built {
    pub config: Vec<u8>,
    pub config_digest: String,
    pub layer_digest: String,
    pub manifest: Vec<u8>,
    pub manifest_digest: String,
}

pub(crate) fn digest_of(bytes: &[u8]) -> String {
    flotilla_net::sha256_digest(bytes)
}

/// The config blob of the layout: `created`, `author`, `architecture`, `os`, `layerDigests`,
/// and the component's surface with the world it targets.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct WasmConfig<'a> {
    created: String,
    author: Option<String>,
    architecture: &'static str,
    os: &'static str,
    layer_digests: [&'a str; 1],
    component: ComponentConfig<'a>,
}

#[derive(Serialize)]
struct ComponentConfig<'a> {
    exports: Vec<String>,
    imports: Vec<String>,
    target: &'a str,
}

/// Builds config (imports and exports read from the component's sections) and manifest.
pub(crate) fn build(
    wasm: &[u8],
    file_name: &str,
    world: &str,
    annotations: &PushAnnotations,
) -> Result<Built, OciError> {
    let surface = surface::read(wasm).map_err(|why| OciError::InvalidComponent {
        source_name: file_name.to_string(),
        why: format!("cannot read its WIT world: {why}"),
    })?;
    let created = annotations
        .0
        .get("org.opencontainers.image.created")
        .and_then(|created| chrono::DateTime::parse_from_rfc3339(created).ok())
        .map_or_else(chrono::Utc::now, |t| t.with_timezone(&chrono::Utc));
    let layer_digest = digest_of(wasm);
    let config = WasmConfig {
        created: created.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true),
        author: None,
        architecture: WASM_ARCHITECTURE,
        os: COMPONENT_OS,
        layer_digests: [&layer_digest],
        component: ComponentConfig {
            exports: surface.exports,
            imports: surface.imports,
            target: world,
        },
    };
    let config = serde_json::to_vec(&config).map_err(|e| OciError::InvalidComponent {
        source_name: file_name.to_string(),
        why: e.to_string(),
    })?;
    let config_digest = digest_of(&config);
    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": MANIFEST_MEDIA_TYPE,
        "config": {
            "mediaType": CONFIG_MEDIA_TYPE,
            "digest": config_digest,
            "size": config.len(),
        },
        "layers": [{
            "mediaType": LAYER_MEDIA_TYPE,
            "digest": layer_digest,
            "size": wasm.len(),
            "annotations": { "org.opencontainers.image.title": file_name },
        }],
        "annotations": annotations.0,
    });
    let manifest = serde_json::to_vec(&manifest).map_err(|e| OciError::InvalidComponent {
        source_name: file_name.to_string(),
        why: e.to_string(),
    })?;
    Ok(Built {
        manifest_digest: digest_of(&manifest),
        config,
        config_digest,
        layer_digest,
        manifest,
    })
}

/// A manifest that passed every check: exactly one `application/wasm` layer and a CNCF config.
#[derive(Debug, Clone, Serialize)]
pub struct ManifestCheck {
    /// The manifest's own digest.
    pub digest: String,
    /// Manifest size in bytes.
    pub manifest_size: u64,
    /// Config blob digest.
    pub config_digest: String,
    /// Config blob size.
    pub config_size: u64,
    /// The wasm layer digest.
    pub layer_digest: String,
    /// The wasm layer size.
    pub layer_size: u64,
    /// The manifest annotations.
    pub annotations: BTreeMap<String, String>,
}

fn descriptor(v: &Value) -> Option<(String, String, u64)> {
    let media = v.get("mediaType")?.as_str()?.to_string();
    let digest = v.get("digest")?.as_str()?.to_string();
    let size = v.get("size")?.as_u64()?;
    Some((media, digest, size))
}

/// One image manifest of schema 2 (not an index), with the Wasm manifest media type if any.
fn single_manifest(v: &Value) -> Result<(), String> {
    let media = v.get("mediaType").and_then(Value::as_str).unwrap_or("");
    if media.contains("index") || media.contains("manifest.list") || v.get("manifests").is_some() {
        return Err(format!(
            "it is an image index ({media}), not a single Wasm artifact manifest"
        ));
    }
    if !media.is_empty() && media != MANIFEST_MEDIA_TYPE {
        return Err(format!(
            "manifest media type {media} (expected {MANIFEST_MEDIA_TYPE})"
        ));
    }
    if v.get("schemaVersion").and_then(Value::as_u64) != Some(2) {
        return Err("manifest schemaVersion is not 2".to_string());
    }
    Ok(())
}

/// A declared blob size within its cap, checked before anything is downloaded.
fn within(what: &'static str, size: u64, limit: u64, reference: &str) -> Result<(), OciError> {
    if size > limit {
        return Err(OciError::TooLarge {
            what,
            reference: reference.to_string(),
            size,
            limit,
        });
    }
    Ok(())
}

impl ManifestCheck {
    /// Checks a manifest's bytes, which must already match `digest`.
    pub(crate) fn parse(reference: &str, digest: &str, bytes: &[u8]) -> Result<Self, OciError> {
        let not = |why: String| OciError::NotWasm {
            reference: reference.to_string(),
            why,
        };
        let v: Value = serde_json::from_slice(bytes)
            .map_err(|e| not(format!("the manifest is not valid JSON ({e})")))?;
        single_manifest(&v).map_err(not)?;
        let (config_media, config_digest, config_size) = v
            .get("config")
            .and_then(descriptor)
            .ok_or_else(|| not("the manifest has no valid config descriptor".to_string()))?;
        if config_media != CONFIG_MEDIA_TYPE {
            return Err(not(format!(
                "config media type {config_media} (expected {CONFIG_MEDIA_TYPE}); is this a container image or an old-style Wasm artifact?"
            )));
        }
        let layers = v
            .get("layers")
            .and_then(Value::as_array)
            .ok_or_else(|| not("the manifest has no layers".to_string()))?;
        if layers.len() != 1 {
            return Err(not(format!(
                "it has {} layers; a plugin artifact has exactly one {LAYER_MEDIA_TYPE} layer",
                layers.len()
            )));
        }
        let (layer_media, layer_digest, layer_size) = layers
            .first()
            .and_then(descriptor)
            .ok_or_else(|| not("its layer descriptor is incomplete".to_string()))?;
        if layer_media != LAYER_MEDIA_TYPE {
            return Err(not(format!(
                "layer media type {layer_media} (expected {LAYER_MEDIA_TYPE})"
            )));
        }
        for d in [&config_digest, &layer_digest] {
            if !valid_digest(d) {
                return Err(not(format!("unsupported digest {d:?} (only sha256)")));
            }
        }
        within("config", config_size, MAX_CONFIG, reference)?;
        within("wasm layer", layer_size, MAX_LAYER, reference)?;
        let annotations = v
            .get("annotations")
            .and_then(Value::as_object)
            .map(|m| {
                m.iter()
                    .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                    .collect()
            })
            .unwrap_or_default();
        Ok(ManifestCheck {
            digest: digest.to_string(),
            manifest_size: bytes.len() as u64,
            config_digest,
            config_size,
            layer_digest,
            layer_size,
            annotations,
        })
    }
}

/// What `plugin inspect` shows.
#[derive(Debug, Clone, Serialize)]
pub struct ArtifactInfo {
    /// The reference as given.
    pub reference: String,
    /// The manifest digest (pin with `@` this).
    pub digest: String,
    /// Manifest, config and layer bytes together.
    pub total_size: u64,
    /// The wasm layer size.
    pub layer_size: u64,
    /// The wasm layer digest.
    pub layer_digest: String,
    /// Manifest annotations.
    pub annotations: BTreeMap<String, String>,
    /// The world the component targets.
    pub world: String,
    /// Imports, as recorded in the config.
    pub imports: Vec<String>,
    /// Exports, as recorded in the config.
    pub exports: Vec<String>,
}

impl ArtifactInfo {
    /// Combines a checked manifest and its config blob.
    pub(crate) fn new(reference: &str, m: &ManifestCheck, config: &[u8]) -> Result<Self, OciError> {
        let v: Value = serde_json::from_slice(config).map_err(|e| OciError::NotWasm {
            reference: reference.to_string(),
            why: format!("the config blob is not valid JSON ({e})"),
        })?;
        let list = |key: &str| -> Vec<String> {
            v.pointer(&format!("/component/{key}"))
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(|s| s.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default()
        };
        let exports = list("exports");
        let world = v
            .pointer("/component/target")
            .and_then(Value::as_str)
            .map(str::to_string)
            .or_else(|| {
                exports.iter().find_map(|e| {
                    e.strip_prefix("flotilla:provider/instance-group")
                        .map(|ver| format!("flotilla:provider/provider{ver}"))
                })
            })
            .unwrap_or_else(|| "(unknown)".to_string());
        Ok(ArtifactInfo {
            reference: reference.to_string(),
            digest: m.digest.clone(),
            total_size: m.manifest_size + m.config_size + m.layer_size,
            layer_size: m.layer_size,
            layer_digest: m.layer_digest.clone(),
            annotations: m.annotations.clone(),
            world,
            imports: list("imports"),
            exports,
        })
    }

    /// Human-readable form. Everything but the digests and sizes comes from the registry, so
    /// control characters and bidi overrides are shown escaped (`\u{1b}`): a registry's text
    /// cannot move the cursor, recolour the terminal or forge a line of this output.
    pub fn render(&self) -> String {
        let mut out = format!(
            "reference: {}\ndigest:    {}\nsize:      {} bytes (wasm layer {} bytes, {})\nworld:     {}\n",
            shown(&self.reference),
            shown(&self.digest),
            self.total_size,
            self.layer_size,
            shown(&self.layer_digest),
            shown(&self.world)
        );
        if !self.annotations.is_empty() {
            out.push_str("annotations:\n");
            for (k, v) in &self.annotations {
                out.push_str(&format!("  {} = {}\n", shown(k), shown(v)));
            }
        }
        out.push_str("imports:\n");
        for i in &self.imports {
            out.push_str(&format!("  {}\n", shown(i)));
        }
        out.push_str("exports:\n");
        for e in &self.exports {
            out.push_str(&format!("  {}\n", shown(e)));
        }
        out
    }
}

/// `text` for a terminal: control characters (C0, DEL, C1) and the bidi embedding, override
/// and isolate characters escaped as `\u{..}`, the rest as it is.
pub fn shown(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() || matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}') {
            out.push_str(&format!("\\u{{{:x}}}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_text_cannot_steer_the_terminal_or_forge_a_line() {
        let hostile =
            "\u{1b}]0;owned\u{7}\u{1b}[2J\rdigest:    sha256:forged\n\u{202E}gpj.exe\u{9b}";
        let info = ArtifactInfo {
            reference: "oci://r/p:1".into(),
            digest: "sha256:aa".into(),
            total_size: 3,
            layer_size: 1,
            layer_digest: "sha256:bb".into(),
            annotations: BTreeMap::from([(
                "org.opencontainers.image.description".into(),
                hostile.into(),
            )]),
            world: hostile.into(),
            imports: vec![hostile.into()],
            exports: vec!["flotilla:provider/instance-group@0.1.3".into()],
        };
        let text = info.render();
        assert!(
            !text.chars().any(|c| c.is_control() && c != '\n'),
            "{text:?}"
        );
        assert!(!text.contains('\u{202E}'), "{text:?}");
        assert_eq!(
            text.lines().filter(|l| l.starts_with("digest:")).count(),
            1,
            "{text}"
        );
        assert!(text.contains("\\u{1b}]0;owned\\u{7}"), "{text}");
        assert_eq!(
            shown("plain wasi:http/types@0.2.0"),
            "plain wasi:http/types@0.2.0"
        );
    }
}
