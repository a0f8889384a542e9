//! `[pool.connector]`: how the host reaches a pool's instances, with taskscaler's names where
//! the meaning is the same (`connector_config`, `instance_ready_command`).

use std::path::PathBuf;
use std::time::Duration;

use ipnet::IpNet;
use serde::Deserialize;

use flotilla_validate::{Context, KeyPath, Problems, Validate};

/// `[pool.connector]` as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConnectorConfig {
    /// Overrides the login user the plugin reports.
    #[serde(default)]
    pub username: Option<String>,
    /// Overrides the SSH port the plugin reports (Docker Machine's `*-ssh-port`).
    #[serde(default)]
    pub port: Option<u16>,
    /// Connect to the external address instead of the internal one.
    #[serde(default)]
    pub use_external_address: bool,
    /// The pool's private key, `{ file = "..." }` (0600); generated under the state directory
    /// when absent.
    #[serde(default)]
    pub ssh_key: Option<KeyFile>,
    /// A command that must exit 0 on the instance before it takes jobs.
    #[serde(default)]
    pub ready_command: Option<String>,
    /// How long the ready command may run.
    #[serde(default = "default_ready_timeout", with = "humantime_serde")]
    pub ready_timeout: Duration,
    /// TCP connect, SSH handshake and login.
    #[serde(default = "default_connect_timeout", with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// Keep-alive interval of the session kept to each instance.
    #[serde(default = "default_keepalive", with = "humantime_serde")]
    pub keepalive_interval: Duration,
    /// Host-key trust: `"pin"` (the default) or `{ known_hosts = "path" }`.
    #[serde(default)]
    pub host_key: HostKeyConfig,
    /// Check Docker Engine through the SSH session (default); `false` for instances that run
    /// jobs without Docker.
    #[serde(default = "yes")]
    pub docker: bool,
    /// Docker Engine's socket on the instance.
    #[serde(default = "default_docker_socket")]
    pub docker_socket: String,
    /// How often a ready instance without a lease is pinged (Docker `/_ping`, or `true` over
    /// SSH without Docker), so a dead machine is found before a job is given to it. `"0s"`
    /// turns pings off.
    #[serde(default = "default_ping_interval", with = "humantime_serde")]
    pub ping_interval: Duration,
    /// For instances the plugin reports as `docker-tls`: the CA that signs their engines'
    /// certificates and the pool's client certificate and key (0600), all PEM.
    #[serde(default)]
    pub docker_tls: Option<DockerTlsConfig>,
    /// Whether lease holders may create privileged containers through the Docker handle (a
    /// `docker:dind` service needs one). Off: the host refuses them, whatever the driver asks.
    #[serde(default)]
    pub allow_privileged: bool,
    /// The addresses the plugin's `connect-info` may point the host at (CIDRs). Left out:
    /// any address but loopback and link-local.
    #[serde(default)]
    pub allowed_ranges: Option<Vec<IpNet>>,
}

/// `docker_tls = { ca = { file }, cert = { file }, key = { file } }`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DockerTlsConfig {
    /// CA certificates of the instances' engines.
    pub ca: KeyFile,
    /// The pool's client certificate.
    pub cert: KeyFile,
    /// Its private key.
    pub key: KeyFile,
}

fn default_ping_interval() -> Duration {
    Duration::from_secs(30)
}

fn yes() -> bool {
    true
}
fn default_docker_socket() -> String {
    "/var/run/docker.sock".to_string()
}

/// `{ file = "path" }`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyFile {
    /// The file, relative to the config file.
    pub file: PathBuf,
}

/// `host_key = "pin"` or `host_key = { known_hosts = "path" }`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum HostKeyConfig {
    /// Trust the key an instance shows first, for its life.
    #[default]
    Pin,
    /// Trust only the keys in a known_hosts file (relative to the config file).
    KnownHosts(PathBuf),
}

impl<'de> Deserialize<'de> for HostKeyConfig {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Name(String),
            File { known_hosts: PathBuf },
        }
        match Raw::deserialize(d)? {
            Raw::Name(name) if name == "pin" => Ok(HostKeyConfig::Pin),
            Raw::Name(other) => Err(serde::de::Error::custom(format!(
                "{other:?}: expected \"pin\" or {{ known_hosts = \"path\" }}"
            ))),
            Raw::File { known_hosts } => Ok(HostKeyConfig::KnownHosts(known_hosts)),
        }
    }
}

fn default_ready_timeout() -> Duration {
    Duration::from_secs(300)
}
fn default_connect_timeout() -> Duration {
    Duration::from_secs(10)
}
fn default_keepalive() -> Duration {
    Duration::from_secs(15)
}

/// Validated connector settings of one pool.
#[derive(Debug, Clone)]
pub struct ConnectorSettings {
    /// Login user override.
    pub username: Option<String>,
    /// SSH port override.
    pub port: Option<u16>,
    /// Use the external address.
    pub use_external_address: bool,
    /// The operator's key file, when given.
    pub ssh_key: Option<PathBuf>,
    /// The ready command.
    pub ready_command: Option<String>,
    /// Its time limit.
    pub ready_timeout: Duration,
    /// Session deadlines.
    pub connect_timeout: Duration,
    /// Keep-alive interval.
    pub keepalive_interval: Duration,
    /// known_hosts file, or `None` to pin.
    pub known_hosts: Option<PathBuf>,
    /// Docker Engine's socket on the instance, or `None` not to check Docker.
    pub docker_socket: Option<String>,
    /// How often idle ready instances are pinged; `None`: never.
    pub ping_interval: Option<Duration>,
    /// The `docker-tls` files, when set.
    pub docker_tls: Option<crate::tls::DockerTlsFiles>,
    /// Whether privileged containers may be created through the Docker handle.
    pub allow_privileged: bool,
    /// Where plugin-chosen addresses may point.
    pub targets: crate::targets::AllowedTargets,
}

impl ConnectorConfig {
    /// The keys whose text must not be empty, and the socket path's form.
    fn check_text(&self, at: &KeyPath, problems: &mut Problems) -> bool {
        let mut ok = true;
        if self.username.as_deref() == Some("") {
            problems.add(
                &at.key("username"),
                "is empty; leave it out to use the plugin's",
            );
            ok = false;
        }
        if self.docker && !self.docker_socket.starts_with('/') {
            problems.add(
                &at.key("docker_socket"),
                "must be an absolute path on the instance",
            );
            ok = false;
        }
        if self
            .ready_command
            .as_deref()
            .is_some_and(|c| c.trim().is_empty())
        {
            problems.add(
                &at.key("ready_command"),
                "is empty; leave it out to skip it",
            );
            ok = false;
        }
        ok
    }

    /// The files it names, resolved against the config file's directory (each checked to
    /// exist when `cx` says so): the SSH key, the Docker TLS files, the known_hosts file.
    fn files(
        &self,
        cx: &Context,
        at: &KeyPath,
        problems: &mut Problems,
        ok: &mut bool,
    ) -> (
        Option<PathBuf>,
        Option<crate::tls::DockerTlsFiles>,
        Option<PathBuf>,
    ) {
        let mut existing = |key: KeyPath, path: &PathBuf| {
            let path = cx.resolve(path);
            if cx.check_files && !path.is_file() {
                problems.add(
                    &key,
                    format!("{} does not exist or is not a file", path.display()),
                );
                *ok = false;
            }
            path
        };
        let ssh_key = self
            .ssh_key
            .as_ref()
            .map(|k| existing(at.key("ssh_key").key("file"), &k.file));
        let docker_tls = self.docker_tls.as_ref().map(|t| {
            let at = at.key("docker_tls");
            crate::tls::DockerTlsFiles {
                ca: existing(at.key("ca").key("file"), &t.ca.file),
                cert: existing(at.key("cert").key("file"), &t.cert.file),
                key: existing(at.key("key").key("file"), &t.key.file),
            }
        });
        let known_hosts = match &self.host_key {
            HostKeyConfig::Pin => None,
            HostKeyConfig::KnownHosts(known_hosts) => {
                Some(existing(at.key("host_key").key("known_hosts"), known_hosts))
            }
        };
        (ssh_key, docker_tls, known_hosts)
    }

    /// The machines it may reach: a non-empty range list, a port in range.
    fn check_targets(&self, at: &KeyPath, problems: &mut Problems) -> bool {
        let mut ok = true;
        if self.allowed_ranges.as_ref().is_some_and(Vec::is_empty) {
            problems.add(
                &at.key("allowed_ranges"),
                "is empty, so no machine could be reached; leave it out for the default (any address but loopback and link-local)",
            );
            ok = false;
        }
        if self.port == Some(0) {
            problems.add(&at.key("port"), "must be 1-65535");
            ok = false;
        }
        ok
    }
}

impl Validate for ConnectorConfig {
    type Output = ConnectorSettings;

    fn validate(
        &self,
        cx: &Context,
        at: &KeyPath,
        problems: &mut Problems,
    ) -> Option<ConnectorSettings> {
        let mut ok = problems.nonzero_durations(
            at,
            &[
                ("ready_timeout", self.ready_timeout),
                ("connect_timeout", self.connect_timeout),
                ("keepalive_interval", self.keepalive_interval),
            ],
        );
        ok &= self.check_text(at, problems);
        let (ssh_key, docker_tls, known_hosts) = self.files(cx, at, problems, &mut ok);
        ok &= self.check_targets(at, problems);
        ok.then(|| ConnectorSettings {
            username: self.username.clone(),
            port: self.port,
            use_external_address: self.use_external_address,
            ssh_key,
            ready_command: self.ready_command.clone(),
            ready_timeout: self.ready_timeout,
            connect_timeout: self.connect_timeout,
            keepalive_interval: self.keepalive_interval,
            known_hosts,
            docker_socket: self.docker.then(|| self.docker_socket.clone()),
            ping_interval: (!self.ping_interval.is_zero()).then_some(self.ping_interval),
            docker_tls,
            allow_privileged: self.allow_privileged,
            targets: crate::targets::AllowedTargets::ranges(
                self.allowed_ranges.clone().unwrap_or_default(),
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<HostKeyConfig, serde_json::Error> {
        serde_json::from_str(json)
    }

    #[test]
    fn host_key_takes_pin_or_a_known_hosts_file() {
        assert_eq!(parse(r#""pin""#).ok(), Some(HostKeyConfig::Pin));
        assert_eq!(
            parse(r#"{"known_hosts": "kh"}"#).ok(),
            Some(HostKeyConfig::KnownHosts("kh".into()))
        );
    }

    #[test]
    fn any_other_host_key_policy_is_refused() {
        let err = parse(r#""trust-everything""#).expect_err("refused");
        assert!(err.to_string().contains("expected \"pin\""), "{err}");
    }

    #[test]
    fn zero_timeouts_and_empty_strings_are_each_reported() {
        let config: ConnectorConfig = serde_json::from_str(
            r#"{"ready_timeout": "0s", "connect_timeout": "0s", "username": "", "ready_command": " "}"#,
        )
        .expect("parse");
        let cx = Context {
            base_dir: ".".into(),
            check_files: false,
        };
        let mut problems = Problems::default();
        let at = KeyPath::root().key("connector");
        assert!(config.validate(&cx, &at, &mut problems).is_none());
        let keys: Vec<String> = problems
            .into_vec()
            .iter()
            .map(|p| p.path.to_string())
            .collect();
        assert_eq!(
            keys,
            [
                "connector.ready_timeout",
                "connector.connect_timeout",
                "connector.username",
                "connector.ready_command"
            ]
        );
    }
}
