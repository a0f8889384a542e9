//! The allow-list grammar: `scheme://host[:port]` entries with `*.suffix` wildcards. Used for a
//! pool's egress and for the hosts a credential is bound to. An empty list allows nothing.
//! This module parses and matches; it knows nothing of HTTP clients or config files.

use std::fmt;
use std::str::FromStr;

/// Why an allow-list entry was refused, for config errors.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("entry {entry:?}: {reason}")]
pub struct AllowListError {
    /// The offending entry.
    pub entry: String,
    /// What is wrong with it.
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum HostPattern {
    Exact(String),
    /// `*.example.com`: any host strictly below `example.com`.
    Suffix(String),
}

/// One `scheme://host[:port]` entry of an allow-list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowedHost {
    scheme: String,
    host: HostPattern,
    port: u16,
}

fn default_port(scheme: &str) -> Option<u16> {
    match scheme {
        "http" => Some(80),
        "https" => Some(443),
        _ => None,
    }
}

impl FromStr for AllowedHost {
    type Err = AllowListError;

    fn from_str(entry: &str) -> Result<Self, Self::Err> {
        let err = |reason: &str| AllowListError {
            entry: entry.to_string(),
            reason: reason.to_string(),
        };
        let (scheme, rest) = entry
            .split_once("://")
            .ok_or_else(|| err("expected scheme://host[:port], e.g. https://api.example.com"))?;
        let scheme = scheme.to_ascii_lowercase();
        let default = default_port(&scheme).ok_or_else(|| err("scheme must be http or https"))?;
        if rest.contains(['/', '?', '#']) {
            return Err(err("must not contain a path, query or fragment"));
        }
        if rest.contains('@') {
            return Err(err("must not contain user info"));
        }
        let (host, port) =
            split_host_port(rest).ok_or_else(|| err("port must be a number from 1 to 65535"))?;
        let port = port.unwrap_or(default);
        let host = host.to_ascii_lowercase();
        if host.is_empty() {
            return Err(err("host is empty"));
        }
        let pattern = if let Some(suffix) = host.strip_prefix("*.") {
            if suffix.is_empty() || suffix.contains('*') {
                return Err(err("a wildcard must look like *.example.com"));
            }
            HostPattern::Suffix(suffix.to_string())
        } else if host.contains('*') {
            return Err(err("a wildcard is only allowed as a leading *. label"));
        } else {
            HostPattern::Exact(host)
        };
        Ok(AllowedHost {
            scheme,
            host: pattern,
            port,
        })
    }
}

/// Splits `host[:port]`, understanding `[v6]:port`. `None` means a bad port.
fn split_host_port(s: &str) -> Option<(String, Option<u16>)> {
    let parse_port = |p: &str| p.parse::<u16>().ok().filter(|p| *p != 0);
    if let Some(rest) = s.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        return match after {
            "" => Some((host.to_string(), None)),
            _ => Some((
                host.to_string(),
                Some(parse_port(after.strip_prefix(':')?)?),
            )),
        };
    }
    match s.rsplit_once(':') {
        Some((host, port)) => Some((host.to_string(), Some(parse_port(port)?))),
        None => Some((s.to_string(), None)),
    }
}

impl AllowedHost {
    fn matches(&self, scheme: &str, host: &str, port: u16) -> bool {
        if self.scheme != scheme || self.port != port {
            return false;
        }
        match &self.host {
            HostPattern::Exact(h) => h == host,
            HostPattern::Suffix(suffix) => host
                .strip_suffix(suffix.as_str())
                .is_some_and(|prefix| prefix.len() > 1 && prefix.ends_with('.')),
        }
    }
}

impl fmt::Display for AllowedHost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.host {
            HostPattern::Exact(h) => write!(f, "{}://{}:{}", self.scheme, h, self.port),
            HostPattern::Suffix(s) => write!(f, "{}://*.{}:{}", self.scheme, s, self.port),
        }
    }
}

/// A pool's egress allow-list. Empty means nothing is allowed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowList(Vec<AllowedHost>);

impl AllowList {
    /// Parses every entry and returns every bad one at once.
    pub fn parse<S: AsRef<str>>(entries: &[S]) -> Result<AllowList, Vec<AllowListError>> {
        let mut ok = Vec::new();
        let mut errors = Vec::new();
        for entry in entries {
            match entry.as_ref().parse() {
                Ok(h) => ok.push(h),
                Err(e) => errors.push(e),
            }
        }
        if errors.is_empty() {
            Ok(AllowList(ok))
        } else {
            Err(errors)
        }
    }

    /// Whether a request target is allowed; `Err` says why not.
    pub fn check(&self, uri: &http::Uri) -> Result<(), NotAllowed> {
        let scheme = uri
            .scheme_str()
            .map(str::to_ascii_lowercase)
            .ok_or(NotAllowed::NoScheme)?;
        let host = uri.host().ok_or(NotAllowed::NoHost)?;
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_ascii_lowercase();
        let port = match uri.port_u16() {
            Some(p) => p,
            None => default_port(&scheme).ok_or_else(|| NotAllowed::Scheme(scheme.clone()))?,
        };
        if self.0.is_empty() {
            return Err(NotAllowed::EmptyList);
        }
        if self.0.iter().any(|h| h.matches(&scheme, &host, port)) {
            Ok(())
        } else {
            Err(NotAllowed::NotListed(format!("{scheme}://{host}:{port}")))
        }
    }
}

/// Why a request target is refused by an allow-list.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotAllowed {
    /// The URI has no scheme.
    #[error("request has no scheme")]
    NoScheme,
    /// The URI has no host.
    #[error("request has no host")]
    NoHost,
    /// Only http and https are ever allowed.
    #[error("scheme {0} is not allowed")]
    Scheme(String),
    /// An empty list allows nothing.
    #[error("the allow-list is empty, so all outbound HTTP is denied")]
    EmptyList,
    /// The normalised `scheme://host:port` matches no entry.
    #[error("{0} is not in the allow-list")]
    NotListed(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(entries: &[&str]) -> AllowList {
        match AllowList::parse(entries) {
            Ok(l) => l,
            Err(e) => panic!("{e:?}"),
        }
    }

    fn uri(s: &str) -> http::Uri {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn empty_denies_everything() {
        assert!(list(&[]).check(&uri("https://example.com/")).is_err());
    }

    #[test]
    fn exact_host_scheme_and_port() {
        let l = list(&["https://api.example.com", "http://127.0.0.1:8080"]);
        assert!(l.check(&uri("https://api.example.com/x")).is_ok());
        assert!(l.check(&uri("https://API.example.com:443/x")).is_ok());
        assert!(
            l.check(&uri("http://api.example.com/x")).is_err(),
            "wrong scheme"
        );
        assert!(
            l.check(&uri("https://api.example.com:8443/x")).is_err(),
            "wrong port"
        );
        assert!(l.check(&uri("https://evil.example.com/")).is_err());
        assert!(l.check(&uri("http://127.0.0.1:8080/")).is_ok());
        assert!(l.check(&uri("http://127.0.0.1:8081/")).is_err());
        assert!(l.check(&uri("http://127.0.0.1/")).is_err());
    }

    #[test]
    fn wildcard_matches_only_subdomains() {
        let l = list(&["https://*.amazonaws.com"]);
        assert!(
            l.check(&uri("https://ec2.us-east-1.amazonaws.com/"))
                .is_ok()
        );
        assert!(l.check(&uri("https://amazonaws.com/")).is_err());
        assert!(l.check(&uri("https://evilamazonaws.com/")).is_err());
        assert!(l.check(&uri("https://amazonaws.com.evil.net/")).is_err());
    }

    #[test]
    fn bad_entries_are_all_reported() {
        let errs = match AllowList::parse(&[
            "https://ok.example.com",
            "https://a.example.com/path",
            "https://b.example.com:99999",
            "https://c.example.com:0",
            "ftp://d.example.com",
            "e.example.com",
            "https://f.*.com",
        ]) {
            Ok(_) => panic!("bad entries accepted"),
            Err(e) => e,
        };
        let entries: Vec<_> = errs.iter().map(|e| e.entry.as_str()).collect();
        assert_eq!(
            entries,
            [
                "https://a.example.com/path",
                "https://b.example.com:99999",
                "https://c.example.com:0",
                "ftp://d.example.com",
                "e.example.com",
                "https://f.*.com"
            ]
        );
    }

    #[test]
    fn ipv6_literals() {
        let l = list(&["http://[::1]:9000"]);
        assert!(l.check(&uri("http://[::1]:9000/")).is_ok());
        assert!(l.check(&uri("http://[::1]:9001/")).is_err());
    }
}
