//! The configuration file. Each room owns the shape of its part (`deny_unknown_fields`) and a
//! `validate` that turns it into its runtime type; this module composes them into one file,
//! reports every problem at once with its file, line and key, and builds nothing when any
//! problem was found.

pub(crate) mod locate;
mod pool;
mod serde_errors;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use flotilla_credentials::SecretSource;
use flotilla_oci::RegistryOptions;
use flotilla_oci::config::OciConfig;
use flotilla_validate::{Context, KeyPath, Problems, Validate};

pub use flotilla_plugin_runtime::loader::PluginSource;
pub use pool::{PluginParts, Pool, PoolConfig};

use locate::Locator;

/// The whole file as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// The HTTP server (lease API, status, metrics).
    #[serde(default)]
    pub server: ServerConfig,
    /// Where compiled and pulled plugins are cached (relative to this file).
    #[serde(default)]
    pub cache_dir: Option<PathBuf>,
    /// Where the host keeps state that must survive restarts (pool SSH keys), relative to this
    /// file; default: the user's data directory (`~/.local/share/flotilla`).
    #[serde(default)]
    pub state_dir: Option<PathBuf>,
    /// How `oci://` plugins are fetched.
    #[serde(default)]
    pub oci: OciConfig,
    /// The pools.
    #[serde(default, rename = "pool")]
    pub pools: Vec<PoolConfig>,
}

/// `[server]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    /// Listen address, e.g. `127.0.0.1:8080`.
    #[serde(default = "default_listen")]
    pub listen: SocketAddr,
    /// A second listener serving only `/metrics`, `/healthz` and `/readyz` (no lease API), so a
    /// metrics scraper or a kubelet can be let in where API clients are not.
    #[serde(default)]
    pub metrics_listen: Option<SocketAddr>,
    /// Bearer token guarding `/v1/*`: `{ value = "..." }`, `{ env = "VAR" }` or `{ file = "path" }`.
    #[serde(default)]
    pub token: Option<SecretSource>,
    /// How long SIGTERM waits for leases to be released.
    #[serde(default = "default_grace", with = "humantime_serde")]
    pub shutdown_grace: Duration,
    /// Connections served at once per listener; a further one is answered 503
    /// `too_many_requests` at once and closed.
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    /// Connections that have not yet made an authenticated request; past this the oldest is
    /// closed, so a flood of idle connections cannot keep API clients out.
    #[serde(default = "default_max_unauthenticated")]
    pub max_unauthenticated_connections: usize,
    /// How long a client may take to send a request's headers (also the idle limit of a
    /// kept-alive connection).
    #[serde(default = "default_header_read_timeout", with = "humantime_serde")]
    pub header_read_timeout: Duration,
    /// Acquires waiting at once. A connection waiting in one counts here, not under
    /// `max_connections`; past this an acquire is answered 503 `too_many_requests` at once.
    #[serde(default = "default_max_long_polls")]
    pub max_long_polls: usize,
    /// Upgraded Docker streams (exec, attach) open at once through the leases' handles;
    /// past this an upgrade is answered 503 `too_many_requests`.
    #[serde(default = "default_max_streams")]
    pub max_streams: usize,
    /// TLS on the API listener: `{ cert = { file = "..." }, key = { file = "..." } }`, PEM,
    /// reloaded when either file changes.
    #[serde(default)]
    pub tls: Option<ServerTlsConfig>,
    /// The read-only bearer token of `/sd/prometheus` (Prometheus's HTTP service discovery of
    /// the pools' machines); never the lease token. Absent: the endpoint answers every request
    /// 401, naming this setting.
    #[serde(default)]
    pub sd_token: Option<SecretSource>,
    /// A file the machine list is written to in Prometheus's `file_sd_configs` format (the
    /// same groups as `/sd/prometheus`), for a Prometheus that reads files rather than
    /// asking over HTTP. Absent: no file.
    #[serde(default)]
    pub file_sd: Option<PathBuf>,
    /// `[[server.operator]]`: named tokens for the people who use the API by hand (an
    /// operator's terminal into a job). Each is as powerful as `token`; the host logs the
    /// name of the token a terminal session came with, which the client cannot choose.
    #[serde(default, rename = "operator")]
    pub operators: Vec<OperatorConfig>,
}

/// `[[server.operator]]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OperatorConfig {
    /// Who holds the token, as the log names them: letters, digits, `.`, `_`, `-` and `@`, at
    /// most 64.
    pub name: String,
    /// Their bearer token for `/v1/*`.
    pub token: SecretSource,
}

/// `[server] tls`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerTlsConfig {
    /// The certificate chain, leaf first.
    pub cert: flotilla_connector::config::KeyFile,
    /// Its private key (0600).
    pub key: flotilla_connector::config::KeyFile,
}

fn default_max_connections() -> usize {
    crate::serve::Limits::default().max_connections
}
fn default_max_unauthenticated() -> usize {
    crate::serve::Limits::default().max_unauthenticated
}
fn default_max_long_polls() -> usize {
    crate::serve::Limits::default().max_long_polls
}
fn default_max_streams() -> usize {
    crate::serve::Limits::default().max_streams
}
fn default_header_read_timeout() -> Duration {
    crate::serve::Limits::default().header_read_timeout
}

fn default_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 8080))
}
fn default_grace() -> Duration {
    Duration::from_secs(600)
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: default_listen(),
            metrics_listen: None,
            token: None,
            shutdown_grace: default_grace(),
            max_connections: default_max_connections(),
            max_unauthenticated_connections: default_max_unauthenticated(),
            header_read_timeout: default_header_read_timeout(),
            max_long_polls: default_max_long_polls(),
            max_streams: default_max_streams(),
            tls: None,
            sd_token: None,
            file_sd: None,
            operators: Vec::new(),
        }
    }
}

/// A validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// The file it came from.
    pub path: PathBuf,
    /// Listen address.
    pub listen: SocketAddr,
    /// The metrics-and-health listener, when configured.
    pub metrics_listen: Option<SocketAddr>,
    /// API token source.
    pub token: Option<SecretSource>,
    /// Drain grace period.
    pub shutdown_grace: Duration,
    /// Connection limits of the listeners.
    pub limits: crate::serve::Limits,
    /// The API listener's certificate and key files, for TLS.
    pub tls: Option<(PathBuf, PathBuf)>,
    /// The read-only token of `/sd/prometheus`.
    pub sd_token: Option<SecretSource>,
    /// Where the machine list is written for `file_sd_configs`.
    pub file_sd: Option<PathBuf>,
    /// The operators' named tokens (`[[server.operator]]`).
    pub operators: Vec<(String, SecretSource)>,
    /// Compile and OCI cache directory.
    pub cache_dir: Option<PathBuf>,
    /// State directory (pool SSH keys), when one is configured or known.
    pub state_dir: Option<PathBuf>,
    /// Registry access.
    pub registry: RegistryOptions,
    /// The pools.
    pub pools: Vec<Pool>,
}

/// One problem, located.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Problem {
    /// The file.
    pub file: String,
    /// 1-based line, when known.
    pub line: Option<usize>,
    /// Dotted key path, e.g. `pool[0].policy[1].timezone`.
    pub key: String,
    /// What is wrong.
    pub message: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.line {
            Some(line) => write!(f, "{}:{}: {}: {}", self.file, line, self.key, self.message),
            None => write!(f, "{}: {}: {}", self.file, self.key, self.message),
        }
    }
}

/// Every problem in a configuration.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"))]
pub struct ConfigErrors(pub Vec<Problem>);

/// Reads and validates a configuration file, reporting every problem at once.
pub fn load(path: &Path) -> Result<Config, ConfigErrors> {
    load_with(path, true)
}

/// What the checks after the file's validation look at (`preflight`): the token, the cache,
/// and each pool whose plugin, settings and sandbox validated, even if the file as a whole
/// did not.
#[derive(Debug, Clone, Default)]
pub struct Checkable {
    /// The file.
    pub path: PathBuf,
    /// Compile and OCI cache directory.
    pub cache_dir: Option<PathBuf>,
    /// The API token's source, when it validated.
    pub token: Option<SecretSource>,
    /// The pools that can be checked.
    pub pools: Vec<PluginParts>,
}

/// Reads and validates a configuration file like [`load`], and also returns what the later
/// checks can look at, whether or not the file validated.
pub fn load_checkable(path: &Path) -> (Result<Config, ConfigErrors>, Checkable) {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(_) => return (load(path), Checkable::default()),
    };
    let result = parse(path, &text, true);
    let found = serde_errors::deserialize_all::<FileConfig>(&text);
    let cx = Context {
        base_dir: path.parent().unwrap_or(Path::new(".")).to_path_buf(),
        check_files: true,
    };
    let mut checkable = Checkable {
        path: path.to_path_buf(),
        ..Checkable::default()
    };
    if let Some(raw) = &found.value {
        checkable.cache_dir = raw.cache_dir.as_deref().map(|d| cx.resolve(d));
        let mut scratch = Problems::default();
        checkable.token = raw.server.token.as_ref().and_then(|t| {
            t.check(&KeyPath::root().key("server").key("token"), &mut scratch)
                .then(|| t.resolved(&cx))
        });
        checkable.pools = raw
            .pools
            .iter()
            .enumerate()
            .filter_map(|(i, p)| {
                let here = KeyPath::root().key("pool").index(i);
                let written = KeyPath::from(found.pruned.original(here.segments()));
                p.plugin_parts(&cx, written)
            })
            .collect();
    }
    (result, checkable)
}

/// Like [`load`]; `check_files = false` skips checks that named files exist (for `simulate`).
pub fn load_with(path: &Path, check_files: bool) -> Result<Config, ConfigErrors> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        ConfigErrors(vec![Problem {
            file: path.display().to_string(),
            line: None,
            key: "(file)".to_string(),
            message: format!("cannot read: {e}"),
        }])
    })?;
    parse(path, &text, check_files)
}

/// A problem at `key` of the configuration file `path`, with its line when the file can be
/// read (for the checks made after [`load`], which name keys but hold no text).
pub fn locate(path: &Path, key: &KeyPath, message: String) -> Problem {
    let line = std::fs::read_to_string(path)
        .ok()
        .and_then(|text| Locator::new(&text).line(key.segments()));
    Problem {
        file: path.display().to_string(),
        line,
        key: key.to_string(),
        message,
    }
}

/// Sorts problems as an editor lists them: by file and line (unlocated ones last), then key;
/// and drops repeats.
pub fn sort_problems(problems: &mut Vec<Problem>) {
    problems.sort_by(|a, b| {
        (&a.file, a.line.is_none(), a.line, &a.key).cmp(&(
            &b.file,
            b.line.is_none(),
            b.line,
            &b.key,
        ))
    });
    problems.dedup();
}

/// Validates configuration text that came from `path`.
pub fn parse(path: &Path, text: &str, check_files: bool) -> Result<Config, ConfigErrors> {
    let file = path.display().to_string();
    let locator = Locator::new(text);
    let located = |path: &KeyPath, offset: Option<usize>, message: String| Problem {
        file: file.clone(),
        line: offset
            .map(|o| locator.line_of(o))
            .or_else(|| locator.line(path.segments())),
        key: path.to_string(),
        message,
    };
    // One pass: serde's problems (unknown keys, types, missing keys), then the values of what
    // serde could read, validated; sorted by line, as an editor shows them.
    let found = serde_errors::deserialize_all::<FileConfig>(text);
    let mut all: Vec<Problem> = found
        .problems
        .iter()
        .map(|p| located(&p.path, p.offset, p.message.clone()))
        .collect();
    let cx = Context {
        base_dir: path.parent().unwrap_or(Path::new(".")).to_path_buf(),
        check_files,
    };
    let mut problems = Problems::default();
    let config = found
        .value
        .as_ref()
        .and_then(|raw| raw.validate(&cx, &KeyPath::root(), &mut problems));
    for p in problems.into_vec() {
        let written = found.pruned.original(p.path.segments());
        // A value serde refused was removed before validation: a problem about it (or under
        // it) would be an echo, and so would "no [[pool]]" after every pool was refused.
        let echo = found
            .problems
            .iter()
            .any(|s| written.starts_with(s.path.segments()))
            || found.pruned.lost_elements(&written);
        if !echo {
            all.push(located(&KeyPath::from(written), None, p.message));
        }
    }
    sort_problems(&mut all);
    match config {
        Some(mut config) if all.is_empty() => {
            config.path = path.to_path_buf();
            Ok(config)
        }
        _ if all.is_empty() => Err(ConfigErrors(vec![Problem {
            file: file.clone(),
            line: None,
            key: "(file)".to_string(),
            message: "the configuration is not valid, but no single key was found at fault"
                .to_string(),
        }])),
        _ => Err(ConfigErrors(all)),
    }
}

impl Validate for FileConfig {
    type Output = Config;

    fn validate(&self, cx: &Context, at: &KeyPath, problems: &mut Problems) -> Option<Config> {
        let server = at.key("server");
        let token_ok = self.validate_token(cx, &server, problems);
        let limits = self.server.limits(&server, problems);
        let registry = self.oci.validate(cx, &at.key("oci"), problems);
        let pools = pool::validate_all(&self.pools, cx, &at.key("pool"), problems);
        let metrics_ok = match self.server.metrics_listen {
            // Port 0 on both is two ports the system picks, never the same one.
            Some(m) if m == self.server.listen && m.port() != 0 => {
                problems.add(
                    &server.key("metrics_listen"),
                    format!("is the same address as server.listen ({m}); leave it out to serve /metrics there"),
                );
                false
            }
            _ => true,
        };
        let tls = self.server.tls.as_ref().map(|t| {
            let at = server.key("tls");
            let mut file = |key: &str, f: &flotilla_connector::config::KeyFile| {
                let path = cx.resolve(&f.file);
                if cx.check_files && !path.is_file() {
                    problems.add(
                        &at.key(key).key("file"),
                        format!("{} does not exist or is not a file", path.display()),
                    );
                }
                path
            };
            (file("cert", &t.cert), file("key", &t.key))
        });
        let sd_ok = self
            .server
            .sd_token
            .as_ref()
            .is_none_or(|sd| secret_ok(sd, cx, &server.key("sd_token"), problems));
        let operators = self.validate_operators(cx, &server, problems);
        if !token_ok || !metrics_ok || !sd_ok {
            return None;
        }
        let operators = operators?;
        let limits = limits?;
        Some(Config {
            path: PathBuf::new(),
            listen: self.server.listen,
            metrics_listen: self.server.metrics_listen,
            token: self.server.token.as_ref().map(|t| t.resolved(cx)),
            shutdown_grace: self.server.shutdown_grace,
            limits,
            tls,
            sd_token: self.server.sd_token.as_ref().map(|t| t.resolved(cx)),
            file_sd: self.server.file_sd.as_deref().map(|f| cx.resolve(f)),
            operators,
            cache_dir: self.cache_dir.as_deref().map(|d| cx.resolve(d)),
            state_dir: self
                .state_dir
                .as_deref()
                .map(|d| cx.resolve(d))
                .or_else(|| {
                    directories::ProjectDirs::from("dev", "flotilla", "flotilla")
                        .map(|d| d.data_local_dir().to_path_buf())
                }),
            registry: registry?,
            pools: pools?,
        })
    }
}

impl ServerConfig {
    /// The listeners' limits, or the problems with them.
    fn limits(&self, at: &KeyPath, problems: &mut Problems) -> Option<crate::serve::Limits> {
        let mut ok = true;
        if self.max_connections == 0 {
            problems.add(&at.key("max_connections"), "must be at least 1");
            ok = false;
        }
        if self.max_unauthenticated_connections == 0
            || self.max_unauthenticated_connections > self.max_connections
        {
            problems.add(
                &at.key("max_unauthenticated_connections"),
                format!(
                    "must be between 1 and max_connections ({})",
                    self.max_connections
                ),
            );
            ok = false;
        }
        if self.header_read_timeout.is_zero() {
            problems.add(&at.key("header_read_timeout"), "must be more than 0s");
            ok = false;
        }
        for (key, value) in [
            ("max_long_polls", self.max_long_polls),
            ("max_streams", self.max_streams),
        ] {
            if value == 0 {
                problems.add(&at.key(key), "must be at least 1");
                ok = false;
            }
        }
        ok.then_some(crate::serve::Limits {
            max_connections: self.max_connections,
            max_unauthenticated: self.max_unauthenticated_connections,
            header_read_timeout: self.header_read_timeout,
            max_long_polls: self.max_long_polls,
            max_streams: self.max_streams,
        })
    }
}

impl FileConfig {
    /// `server.token`: required off loopback and whenever a pool has a `[pool.connector]`.
    /// Such a pool serves exec (a shell on every instance, and in instance mode every running
    /// job's script) and, unless `docker = false`, a Docker handle that can start a privileged
    /// container; both are as powerful, so an open API on loopback is an open door for every
    /// local user. A token file must not be readable by others.
    /// `[[server.operator]]`: each name well formed and unique, each token readable, and
    /// `token` set (without it the API is open and a name would prove nothing).
    fn validate_operators(
        &self,
        cx: &Context,
        server: &KeyPath,
        problems: &mut Problems,
    ) -> Option<Vec<(String, SecretSource)>> {
        let mut ok = true;
        let mut names = std::collections::BTreeSet::new();
        for (i, operator) in self.server.operators.iter().enumerate() {
            let at = server.key("operator").index(i);
            let name = &operator.name;
            let well_formed = !name.is_empty()
                && name.len() <= 64
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "._-@".contains(c));
            if !well_formed {
                problems.add(
                    &at.key("name"),
                    format!("{name:?} is not a name the log can carry: 1 to 64 letters, digits, '.', '_', '-' or '@'"),
                );
                ok = false;
            } else if !names.insert(name.as_str()) {
                problems.add(
                    &at.key("name"),
                    format!("{name:?} names another operator too: each token names one person"),
                );
                ok = false;
            }
            ok &= secret_ok(&operator.token, cx, &at.key("token"), problems);
        }
        if !self.server.operators.is_empty() && self.server.token.is_none() {
            problems.add(
                &server.key("operator"),
                "needs server.token: without it the API is open to every local user, and an operator's name would prove nothing",
            );
            ok = false;
        }
        ok.then(|| {
            self.server
                .operators
                .iter()
                .map(|o| (o.name.clone(), o.token.resolved(cx)))
                .collect()
        })
    }

    fn validate_token(&self, cx: &Context, server: &KeyPath, problems: &mut Problems) -> bool {
        let at = server.key("token");
        let Some(token) = &self.server.token else {
            let machines: Vec<&str> = self
                .pools
                .iter()
                .filter(|p| p.connector.is_some())
                .map(|p| p.name.as_str())
                .collect();
            if !self.server.listen.ip().is_loopback() {
                problems.add(
                    &at,
                    format!(
                        "is required when listening on a non-loopback address ({})",
                        self.server.listen
                    ),
                );
                return false;
            }
            if !machines.is_empty() {
                problems.add(
                    &at,
                    format!(
                        "is required because pool(s) {} have a [pool.connector]: their leases' exec endpoint opens a shell on every instance and their Docker handle can run privileged containers there, so on loopback too every local user could; set token = {{ file = \"...\" }}",
                        machines.join(", ")
                    ),
                );
                return false;
            }
            return true;
        };
        secret_ok(token, cx, &at, problems)
    }
}

/// A secret source as written, and for a file that exists, its mode: a secret file others can
/// read is refused.
fn secret_ok(source: &SecretSource, cx: &Context, at: &KeyPath, problems: &mut Problems) -> bool {
    if !source.check(at, problems) {
        return false;
    }
    if let (true, SecretSource::File(path)) = (cx.check_files, source.resolved(cx))
        && path.exists()
        && let Err(why) = flotilla_net::fs::check_secret_file_mode(&path)
    {
        problems.add(at, why.to_string());
        return false;
    }
    true
}
