//! `oci://registry/repository[:tag][@sha256:digest]`: parsed strictly so that a typo is an
//! error at config-check time instead of a pull from somewhere unexpected.

use std::fmt;
use std::net::IpAddr;

use super::OciError;

/// A plugin reference; the registry is always explicit (there is no implicit Docker Hub).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct OciRef {
    /// `host[:port]`.
    pub registry: String,
    /// `path/to/repo`.
    pub repository: String,
    /// The tag, when given.
    pub tag: Option<String>,
    /// `sha256:<64 hex>`, when pinned.
    pub digest: Option<String>,
}

fn bad(reference: &str, why: impl Into<String>) -> OciError {
    OciError::BadReference {
        reference: reference.to_string(),
        why: why.into(),
    }
}

fn valid_component(c: &str) -> bool {
    // [a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*
    let bytes = c.as_bytes();
    let alnum = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    if !bytes.first().is_some_and(alnum) || !bytes.last().is_some_and(alnum) {
        return false;
    }
    c.chars()
        .all(|ch| ch.is_ascii_lowercase() || ch.is_ascii_digit() || matches!(ch, '.' | '_' | '-'))
        && !c.contains("..")
        && !c.contains("___")
}

fn valid_tag(t: &str) -> bool {
    let mut chars = t.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphanumeric() || c == '_')
        && t.len() <= 128
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

fn valid_registry(r: &str) -> bool {
    let (host, port) = match r.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(']') || r.starts_with('[') => (h, Some(p)),
        _ => (r, None),
    };
    if let Some(p) = port
        && p.parse::<u16>().map_or(true, |p| p == 0)
    {
        return false;
    }
    if let Some(inner) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        return inner.parse::<IpAddr>().is_ok();
    }
    !host.is_empty()
        && host.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// Validates a digest string `sha256:<64 lowercase hex>`.
pub(crate) fn valid_digest(d: &str) -> bool {
    d.strip_prefix("sha256:")
        .is_some_and(|h| h.len() == 64 && h.chars().all(|c| matches!(c, '0'..='9' | 'a'..='f')))
}

impl OciRef {
    /// Parses `oci://...`; the `oci://` prefix is optional on the command line.
    pub fn parse(text: &str) -> Result<Self, OciError> {
        let rest = text.strip_prefix("oci://").unwrap_or(text);
        if rest.is_empty() {
            return Err(bad(text, "empty reference"));
        }
        if rest.contains("://") {
            return Err(bad(text, "only the oci:// scheme is supported"));
        }
        let (name, digest) = match rest.split_once('@') {
            Some((n, d)) => {
                if !valid_digest(d) {
                    return Err(bad(
                        text,
                        format!("{d:?} is not a digest like sha256:<64 lowercase hex digits>"),
                    ));
                }
                (n, Some(d.to_string()))
            }
            None => (rest, None),
        };
        let (registry, path) = name.split_once('/').ok_or_else(|| {
            bad(
                text,
                "expected registry/repository[:tag][@sha256:digest], e.g. oci://ghcr.io/acme/aws:1.0",
            )
        })?;
        if !(registry.contains('.') || registry.contains(':') || registry == "localhost")
            || !valid_registry(registry)
        {
            return Err(bad(
                text,
                format!(
                    "{registry:?} is not a registry host; the reference must start with one, e.g. ghcr.io/ or 127.0.0.1:5000/"
                ),
            ));
        }
        let (repository, tag) = match path.rsplit_once(':') {
            Some((repo, tag)) => {
                if !valid_tag(tag) {
                    return Err(bad(
                        text,
                        format!(
                            "{tag:?} is not a valid tag (letters, digits, '_', '.', '-'; at most 128)"
                        ),
                    ));
                }
                (repo, Some(tag.to_string()))
            }
            None => (path, None),
        };
        if repository.is_empty() || !repository.split('/').all(valid_component) {
            return Err(bad(
                text,
                format!(
                    "{repository:?} is not a valid repository (lowercase letters, digits and separators, split by '/')"
                ),
            ));
        }
        if tag.is_none() && digest.is_none() {
            return Err(bad(
                text,
                "add a :tag or an @sha256:digest; there is no implicit :latest",
            ));
        }
        Ok(OciRef {
            registry: registry.to_string(),
            repository: repository.to_string(),
            tag,
            digest,
        })
    }

    /// The same repository pinned to `digest` (keeping the tag for display).
    pub fn pinned(&self, digest: &str) -> OciRef {
        OciRef {
            digest: Some(digest.to_string()),
            ..self.clone()
        }
    }

    /// The same repository at another tag (signature tags).
    pub fn at_tag(&self, tag: &str) -> OciRef {
        OciRef {
            tag: Some(tag.to_string()),
            digest: None,
            ..self.clone()
        }
    }

    /// `registry/repository` without tag or digest.
    pub fn repo_name(&self) -> String {
        format!("{}/{}", self.registry, self.repository)
    }

    /// The host part of the registry, without port or brackets.
    pub fn host(&self) -> &str {
        let host = if self.registry.starts_with('[') {
            self.registry
                .split_once(']')
                .map_or(self.registry.as_str(), |(h, _)| h)
        } else {
            self.registry
                .rsplit_once(':')
                .map_or(self.registry.as_str(), |(h, _)| h)
        };
        host.trim_start_matches('[')
    }

    /// Whether the registry is on this machine (plain HTTP may be allowed there).
    pub fn is_loopback(&self) -> bool {
        let host = self.host();
        host == "localhost" || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
    }

    pub(crate) fn client_ref(&self) -> oci_client::Reference {
        match (&self.tag, &self.digest) {
            (Some(t), Some(d)) => oci_client::Reference::with_tag_and_digest(
                self.registry.clone(),
                self.repository.clone(),
                t.clone(),
                d.clone(),
            ),
            (None, Some(d)) => oci_client::Reference::with_digest(
                self.registry.clone(),
                self.repository.clone(),
                d.clone(),
            ),
            (t, None) => oci_client::Reference::with_tag(
                self.registry.clone(),
                self.repository.clone(),
                t.clone().unwrap_or_else(|| "latest".to_string()),
            ),
        }
    }
}

impl fmt::Display for OciRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "oci://{}/{}", self.registry, self.repository)?;
        if let Some(t) = &self.tag {
            write!(f, ":{t}")?;
        }
        if let Some(d) = &self.digest {
            write!(f, "@{d}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_three_forms() {
        let r = OciRef::parse("oci://127.0.0.1:5000/flotilla/static:1.0").unwrap();
        assert_eq!(r.registry, "127.0.0.1:5000");
        assert_eq!(r.repository, "flotilla/static");
        assert_eq!(r.tag.as_deref(), Some("1.0"));
        assert!(r.is_loopback());
        let d = format!("sha256:{}", "a".repeat(64));
        let r = OciRef::parse(&format!("oci://ghcr.io/acme/aws@{d}")).unwrap();
        assert_eq!(r.digest.as_deref(), Some(d.as_str()));
        assert!(r.tag.is_none());
        assert!(!r.is_loopback());
        let r = OciRef::parse(&format!("localhost:5000/a/b:v1@{d}")).unwrap();
        assert_eq!(r.to_string(), format!("oci://localhost:5000/a/b:v1@{d}"));
    }

    #[test]
    fn rejects_with_reasons() {
        for (text, needle) in [
            ("oci://", "empty"),
            ("oci://flotilla/static:1", "not a registry host"),
            ("oci://ghcr.io/Acme/x:1", "not a valid repository"),
            ("oci://ghcr.io/acme/x", "no implicit :latest"),
            ("oci://ghcr.io/acme/x:bad tag", "not a valid tag"),
            ("oci://ghcr.io/acme/x@sha256:abc", "not a digest"),
            ("https://ghcr.io/acme/x:1", "only the oci://"),
            ("oci://ghcr.io:99999/acme/x:1", "not a registry host"),
            ("oci://ghcr.io", "expected registry/repository"),
        ] {
            let e = OciRef::parse(text).unwrap_err().to_string();
            assert!(e.contains(needle), "{text}: {e}");
        }
    }
}
