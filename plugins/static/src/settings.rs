//! Settings of the static provider, validated all at once.

use serde::Deserialize;
use serde_json::Value;

use crate::flotilla::provider::types::{Arch, Connection, Os, Protocol};

/// The whole `plugin_config` of a static pool.
#[derive(Debug, PartialEq)]
pub struct Settings {
    pub name: String,
    pub hosts: Vec<HostEntry>,
}

/// One pre-existing host.
#[derive(Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct HostEntry {
    /// Stable id; defaults to `address`.
    #[serde(default)]
    pub id: Option<String>,
    pub address: String,
    #[serde(default)]
    pub external_address: Option<String>,
    #[serde(default)]
    pub port: Option<u16>,
    #[serde(default = "default_protocol")]
    pub protocol: String,
    #[serde(default)]
    pub username: String,
    #[serde(default = "default_os")]
    pub os: String,
    #[serde(default = "default_arch")]
    pub arch: String,
    /// The failure domain (a rack, a room, a site), passed on as the machine's zone.
    #[serde(default)]
    pub zone: Option<String>,
}

fn default_protocol() -> String {
    "ssh".to_string()
}
fn default_os() -> String {
    "linux".to_string()
}
fn default_arch() -> String {
    "amd64".to_string()
}

fn parse_os(s: &str) -> Option<Os> {
    Some(match s {
        "linux" => Os::Linux,
        "windows" => Os::Windows,
        "darwin" | "macos" => Os::Darwin,
        "freebsd" => Os::Freebsd,
        _ => return None,
    })
}

fn parse_arch(s: &str) -> Option<Arch> {
    Some(match s {
        "amd64" | "x86_64" => Arch::Amd64,
        "arm64" | "aarch64" => Arch::Arm64,
        "386" | "x86" => Arch::X86,
        "arm" => Arch::Arm,
        _ => return None,
    })
}

fn parse_protocol(s: &str) -> Option<(Protocol, u16)> {
    Some(match s {
        "ssh" => (Protocol::Ssh, 22),
        "winrm" => (Protocol::Winrm, 5986),
        "docker-tls" => (Protocol::DockerTls, 2376),
        _ => return None,
    })
}

impl HostEntry {
    pub fn id(&self) -> &str {
        self.id.as_deref().unwrap_or(&self.address)
    }

    pub fn connect_info(&self) -> Connection {
        // Values were validated in `Settings::parse`; the fallbacks are unreachable.
        let (protocol, default_port) =
            parse_protocol(&self.protocol).unwrap_or((Protocol::Ssh, 22));
        Connection {
            id: self.id().to_string(),
            os: parse_os(&self.os).unwrap_or(Os::Linux),
            arch: parse_arch(&self.arch).unwrap_or(Arch::Amd64),
            protocol,
            internal_address: Some(self.address.clone()),
            external_address: self.external_address.clone(),
            port: self.port.unwrap_or(default_port),
            username: self.username.clone(),
            expires: None,
            zone: self.zone.clone(),
        }
    }

    fn problems(&self, at: &str, out: &mut Vec<String>) {
        if self.address.trim().is_empty() {
            out.push(format!("{at}.address: must not be empty"));
        }
        if self.id.as_deref().is_some_and(|id| id.trim().is_empty()) {
            out.push(format!("{at}.id: must not be empty"));
        }
        if self
            .zone
            .as_deref()
            .is_some_and(|zone| zone.trim().is_empty())
        {
            out.push(format!(
                "{at}.zone: must not be empty (leave it out for no zone)"
            ));
        }
        if parse_os(&self.os).is_none() {
            out.push(format!(
                "{at}.os: unknown os {:?} (linux, windows, darwin, freebsd)",
                self.os
            ));
        }
        if parse_arch(&self.arch).is_none() {
            out.push(format!(
                "{at}.arch: unknown arch {:?} (amd64, arm64, x86, arm)",
                self.arch
            ));
        }
        if parse_protocol(&self.protocol).is_none() {
            out.push(format!(
                "{at}.protocol: unknown protocol {:?} (ssh, winrm, docker-tls)",
                self.protocol
            ));
        }
        if self.port == Some(0) {
            out.push(format!("{at}.port: must be 1-65535"));
        }
    }
}

impl Settings {
    /// Parses the JSON settings and returns every problem found, one per line.
    pub fn parse(text: &str) -> Result<Settings, String> {
        let value: Value =
            serde_json::from_str(text).map_err(|e| format!("settings are not valid JSON: {e}"))?;
        let Value::Object(map) = value else {
            return Err("settings must be a JSON object".to_string());
        };
        let mut problems = Vec::new();
        let mut name = "static".to_string();
        let mut hosts = Vec::new();
        let mut saw_hosts = false;
        for (key, value) in map {
            match key.as_str() {
                "name" => match value {
                    Value::String(s) if !s.trim().is_empty() => name = s,
                    _ => problems.push("name: must be a non-empty string".to_string()),
                },
                "hosts" => {
                    saw_hosts = true;
                    let Value::Array(items) = value else {
                        problems.push("hosts: must be an array of host tables".to_string());
                        continue;
                    };
                    for (i, item) in items.into_iter().enumerate() {
                        let at = format!("hosts[{i}]");
                        match serde_json::from_value::<HostEntry>(item) {
                            Ok(host) => {
                                host.problems(&at, &mut problems);
                                hosts.push(host);
                            }
                            Err(e) => problems.push(format!("{at}: {e}")),
                        }
                    }
                }
                other => problems.push(format!("{other}: unknown key (known: name, hosts)")),
            }
        }
        if !saw_hosts {
            problems.push("hosts: missing; list at least one host".to_string());
        } else if hosts.is_empty() && problems.is_empty() {
            problems.push("hosts: must list at least one host".to_string());
        }
        let mut seen = std::collections::BTreeSet::new();
        for host in &hosts {
            if !seen.insert(host.id()) {
                problems.push(format!("hosts: duplicate id {:?}", host.id()));
            }
        }
        if problems.is_empty() {
            Ok(Settings { name, hosts })
        } else {
            Err(problems.join("; "))
        }
    }
}
