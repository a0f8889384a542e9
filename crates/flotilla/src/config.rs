//! The configuration file: a serde shape with `deny_unknown_fields`, validated once, every
//! problem reported at the same time with its file, line and key.

use std::collections::{BTreeMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use flotilla_credentials::{Credential, CredentialKind, SecretSource};
use flotilla_net::AllowList;
use flotilla_oci::{OciRef, PullPolicy};
use flotilla_plugin_runtime::{EgressPolicy, Limits, Sandbox};
use flotilla_scaler::{Policy, ScalerConfig};

/// The whole file as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// The HTTP server (lease API, status, metrics).
    #[serde(default)]
    pub server: ServerConfig,
    /// Where compiled plugins are cached.
    #[serde(default)]
    pub cache_dir: Option<PathBuf>,
    /// How `oci://` plugins are fetched.
    #[serde(default)]
    pub oci: OciConfig,
    /// The pools.
    #[serde(default, rename = "pool")]
    pub pools: Vec<PoolConfig>,
}

/// `[oci]`: registry access for `oci://` plugins.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OciConfig {
    /// Registries (`host:port`) that may be reached over plain HTTP.
    #[serde(default)]
    pub insecure_registries: Vec<String>,
    /// Registry connect and read timeout.
    #[serde(default, with = "humantime_serde")]
    pub timeout: Option<Duration>,
    /// Extra PEM root certificates for registries (relative to this file).
    #[serde(default)]
    pub tls_ca_files: Vec<PathBuf>,
}

/// `verify = { key = "cosign.pub" }`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VerifyConfig {
    /// cosign public key (PEM), relative to this file.
    pub key: String,
}

pub use flotilla_plugin_runtime::loader::PluginSource;

/// `[server]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    /// Listen address, e.g. `127.0.0.1:8080`.
    #[serde(default = "default_listen")]
    pub listen: String,
    /// Bearer token guarding `/v1/*`: `{ value = "..." }`, `{ env = "VAR" }` or `{ file = "path" }`.
    #[serde(default)]
    pub token: Option<SecretSource>,
    /// How long SIGTERM waits for leases to be released.
    #[serde(default = "default_grace", with = "humantime_serde")]
    pub shutdown_grace: Duration,
}

fn default_listen() -> String {
    "127.0.0.1:8080".to_string()
}
fn default_grace() -> Duration {
    Duration::from_secs(600)
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: default_listen(),
            token: None,
            shutdown_grace: default_grace(),
        }
    }
}

/// `[[pool.policy]]`, with GitLab Runner's names.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyConfig {
    /// 5-field cron expressions.
    #[serde(default = "default_periods")]
    pub periods: Vec<String>,
    /// IANA zone for the periods.
    #[serde(default = "default_tz")]
    pub timezone: String,
    /// Idle job slots to keep.
    #[serde(default)]
    pub idle_count: i64,
    /// How long an unused instance may stay.
    #[serde(default = "default_idle_time", with = "humantime_serde")]
    pub idle_time: Duration,
    /// Extra idle slots per slot in use.
    #[serde(default)]
    pub scale_factor: f64,
    /// Cap on the extra idle slots (0 = none).
    #[serde(default)]
    pub scale_factor_limit: i64,
    /// Reserve only when an idle slot exists.
    #[serde(default)]
    pub preemptive_mode: bool,
}

fn default_periods() -> Vec<String> {
    vec!["* * * * *".to_string()]
}
fn default_tz() -> String {
    "UTC".to_string()
}
fn default_idle_time() -> Duration {
    Duration::from_secs(300)
}

/// `scale_throttle = { limit, burst }`.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Throttle {
    /// Instances per second.
    pub limit: f64,
    /// Bucket size.
    pub burst: i64,
}

/// `[[pool]]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolConfig {
    /// Unique name (used in URLs and metrics).
    pub name: String,
    /// The plugin: a path (relative to this file) to a `.wasm` component, or `oci://...`.
    pub plugin: String,
    /// For `oci://` plugins: `if-not-present` (default) or `always`.
    #[serde(default)]
    pub pull_policy: Option<PullPolicy>,
    /// For `oci://` plugins: require a cosign signature by this key.
    #[serde(default)]
    pub verify: Option<VerifyConfig>,
    /// The plugin's settings, passed to `init` as JSON.
    #[serde(default)]
    pub plugin_config: toml::Table,
    /// Job slots per instance.
    #[serde(default = "one")]
    pub capacity_per_instance: i64,
    /// Jobs per instance before it is replaced (0 = unlimited).
    #[serde(default)]
    pub max_use_count: i64,
    /// Upper bound on instances.
    pub max_instances: i64,
    /// How long acquire waits for a ready instance.
    #[serde(default = "two_minutes", with = "humantime_serde")]
    pub instance_acquire_timeout: Duration,
    /// Safety-net polling of `update()`.
    #[serde(default = "one_minute", with = "humantime_serde")]
    pub update_interval: Duration,
    /// Wait before retrying a deletion.
    #[serde(default = "one_minute", with = "humantime_serde")]
    pub deletion_retry_interval: Duration,
    /// Consecutive readiness failures before replacement.
    #[serde(default = "three")]
    pub failure_threshold: i64,
    /// Delete the pool's instances after draining on shutdown.
    #[serde(default)]
    pub delete_instances_on_shutdown: bool,
    /// Token bucket on instance creation.
    #[serde(default)]
    pub scale_throttle: Option<Throttle>,
    /// Egress allow-list, `scheme://host[:port]`; empty denies all.
    #[serde(default)]
    pub allowed_outbound_hosts: Vec<String>,
    /// Normally refused ranges this pool may reach (e.g. `127.0.0.0/8` for an emulator).
    #[serde(default)]
    pub allowed_ip_ranges: Vec<String>,
    /// Fixed name resolution for the plugin's requests (checked like DNS answers).
    #[serde(default)]
    pub resolve: BTreeMap<String, Vec<IpAddr>>,
    /// Extra CA certificates (PEM files, relative to this file) trusted for HTTPS.
    #[serde(default)]
    pub tls_ca_files: Vec<String>,
    /// Credentials the plugin may name.
    #[serde(default)]
    pub credentials: Vec<toml::Table>,
    /// Plugin resource limits.
    #[serde(default)]
    pub limits: Limits,
    /// Idle policies; the last matching wins.
    #[serde(default)]
    pub policy: Vec<PolicyConfig>,
}

fn one() -> i64 {
    1
}
fn three() -> i64 {
    3
}
fn one_minute() -> Duration {
    Duration::from_secs(60)
}
fn two_minutes() -> Duration {
    Duration::from_secs(120)
}

/// A pool ready to start.
#[derive(Debug, Clone)]
pub struct Pool {
    /// Its name.
    pub name: String,
    /// Where the plugin comes from.
    pub plugin: PluginSource,
    /// `plugin_config` as JSON text.
    pub settings: String,
    /// Scaling knobs.
    pub scaler: ScalerConfig,
    /// Idle policies.
    pub policies: Vec<Policy>,
    /// Sandbox for the plugin.
    pub sandbox: Sandbox,
    /// Delete instances after draining on shutdown.
    pub delete_instances_on_shutdown: bool,
}

/// A validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// The file it came from.
    pub path: PathBuf,
    /// Listen address.
    pub listen: SocketAddr,
    /// API token source.
    pub token: Option<SecretSource>,
    /// Drain grace period.
    pub shutdown_grace: Duration,
    /// Compile cache directory.
    pub cache_dir: Option<PathBuf>,
    /// Registry access.
    pub oci: OciConfig,
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

/// Every problem in a configuration file.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"))]
pub struct ConfigErrors(pub Vec<Problem>);

/// One step of a key path.
#[derive(Debug, Clone)]
enum Seg {
    Key(String),
    Index(usize),
}

fn path_text(path: &[Seg]) -> String {
    let mut s = String::new();
    for seg in path {
        match seg {
            Seg::Key(k) => {
                if !s.is_empty() {
                    s.push('.');
                }
                s.push_str(k);
            }
            Seg::Index(i) => s.push_str(&format!("[{i}]")),
        }
    }
    s
}

/// Finds the line of a key path in the parsed document.
struct Locator {
    doc: Option<toml_edit::Document<String>>,
    text: String,
}

#[derive(Clone, Copy)]
enum Node<'a> {
    Item(&'a toml_edit::Item),
    Table(&'a toml_edit::Table),
    Value(&'a toml_edit::Value),
}

impl Locator {
    fn line_of(&self, offset: usize) -> usize {
        self.text[..offset.min(self.text.len())]
            .matches('\n')
            .count()
            + 1
    }

    fn line(&self, path: &[Seg]) -> Option<usize> {
        let doc = self.doc.as_ref()?;
        Self::find(Node::Table(doc.as_table()), path, None).map(|o| self.line_of(o))
    }

    /// The start offset of the deepest element of `path` that exists.
    fn find(node: Node<'_>, path: &[Seg], best: Option<usize>) -> Option<usize> {
        let Some((seg, rest)) = path.split_first() else {
            return best;
        };
        match seg {
            Seg::Key(key) => {
                let table: &dyn toml_edit::TableLike = match node {
                    Node::Table(t) => t,
                    Node::Item(toml_edit::Item::Table(t)) => t,
                    Node::Item(toml_edit::Item::Value(toml_edit::Value::InlineTable(t))) => t,
                    Node::Value(toml_edit::Value::InlineTable(t)) => t,
                    _ => return best,
                };
                let Some((k, v)) = table.get_key_value(key) else {
                    return best;
                };
                let best = k.span().map(|s| s.start).or(best);
                Self::find(Node::Item(v), rest, best)
            }
            Seg::Index(i) => match node {
                Node::Item(toml_edit::Item::ArrayOfTables(a)) => match a.get(*i) {
                    Some(t) => Self::find(Node::Table(t), rest, t.span().map(|s| s.start).or(best)),
                    None => best,
                },
                Node::Item(toml_edit::Item::Value(toml_edit::Value::Array(a)))
                | Node::Value(toml_edit::Value::Array(a)) => match a.get(*i) {
                    Some(v) => Self::find(Node::Value(v), rest, v.span().map(|s| s.start).or(best)),
                    None => best,
                },
                _ => best,
            },
        }
    }
}

/// Keys each table may hold; `None` marks free-form tables checked elsewhere (or not at all).
fn known_keys(path: &[&str]) -> Option<&'static [&'static str]> {
    Some(match path {
        [] => &["server", "cache_dir", "oci", "pool"],
        ["oci"] => &["insecure_registries", "timeout", "tls_ca_files"],
        ["pool", "verify"] => &["key"],
        ["server"] => &["listen", "token", "shutdown_grace"],
        ["server", "token"] => &["value", "env", "file"],
        ["pool"] => &[
            "name",
            "plugin",
            "plugin_config",
            "pull_policy",
            "verify",
            "capacity_per_instance",
            "max_use_count",
            "max_instances",
            "instance_acquire_timeout",
            "update_interval",
            "deletion_retry_interval",
            "failure_threshold",
            "delete_instances_on_shutdown",
            "scale_throttle",
            "allowed_outbound_hosts",
            "allowed_ip_ranges",
            "resolve",
            "tls_ca_files",
            "credentials",
            "limits",
            "policy",
        ],
        ["pool", "scale_throttle"] => &["limit", "burst"],
        ["pool", "limits"] => &[
            "default_deadline",
            "deadlines",
            "memory_bytes",
            "instances",
            "tables",
            "table_elements",
            "memories",
            "output_bytes",
            "log_lines_per_call",
            "circuit_threshold",
            "circuit_cooldown",
        ],
        ["pool", "policy"] => &[
            "periods",
            "timezone",
            "idle_count",
            "idle_time",
            "scale_factor",
            "scale_factor_limit",
            "preemptive_mode",
        ],
        _ => return None,
    })
}

/// Every unknown key in the document at once (serde would stop at the first).
fn unknown_keys(doc: &toml_edit::Document<String>) -> Vec<(Vec<Seg>, String)> {
    fn walk(
        table: &dyn toml_edit::TableLike,
        names: &mut Vec<&'static str>,
        path: &mut Vec<Seg>,
        out: &mut Vec<(Vec<Seg>, String)>,
    ) {
        let Some(known) = known_keys(names) else {
            return;
        };
        for (key, item) in table.iter() {
            path.push(Seg::Key(key.to_string()));
            match known.iter().find(|k| **k == key) {
                None => out.push((path.clone(), known.join(", "))),
                Some(name) => {
                    names.push(name);
                    match item {
                        toml_edit::Item::ArrayOfTables(a) => {
                            for (i, t) in a.iter().enumerate() {
                                path.push(Seg::Index(i));
                                walk(t, names, path, out);
                                path.pop();
                            }
                        }
                        toml_edit::Item::Value(toml_edit::Value::Array(a)) => {
                            for (i, v) in a.iter().enumerate() {
                                if let Some(t) = v.as_inline_table() {
                                    path.push(Seg::Index(i));
                                    walk(t, names, path, out);
                                    path.pop();
                                }
                            }
                        }
                        other => {
                            if let Some(t) = other.as_table_like() {
                                walk(t, names, path, out);
                            }
                        }
                    }
                    names.pop();
                }
            }
            path.pop();
        }
    }
    let mut out = Vec::new();
    walk(doc.as_table(), &mut Vec::new(), &mut Vec::new(), &mut out);
    out
}

struct Collector<'a> {
    file: String,
    locator: &'a Locator,
    problems: Vec<Problem>,
}

impl Collector<'_> {
    fn add(&mut self, path: &[Seg], message: impl Into<String>) {
        self.problems.push(Problem {
            file: self.file.clone(),
            line: self.locator.line(path),
            key: path_text(path),
            message: message.into(),
        });
    }
}

fn k(s: &str) -> Seg {
    Seg::Key(s.to_string())
}

fn positive(c: &mut Collector<'_>, path: &[Seg], v: i64, min: i64) -> u32 {
    if v < min {
        c.add(path, format!("must be at least {min} (got {v})"));
        return min.max(0) as u32;
    }
    u32::try_from(v).unwrap_or_else(|_| {
        c.add(path, format!("{v} is too large"));
        u32::MAX
    })
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Reads and validates a configuration file, reporting every problem at once.
pub fn load(path: &Path) -> Result<Config, ConfigErrors> {
    load_with(path, true)
}

/// Like [`load`]; `check_plugins = false` skips plugin file checks (for `simulate`).
pub fn load_with(path: &Path, check_plugins: bool) -> Result<Config, ConfigErrors> {
    let file = path.display().to_string();
    let one = |line: Option<usize>, key: &str, message: String| {
        ConfigErrors(vec![Problem {
            file: file.clone(),
            line,
            key: key.to_string(),
            message,
        }])
    };
    let text = std::fs::read_to_string(path)
        .map_err(|e| one(None, "(file)", format!("cannot read: {e}")))?;
    parse(path, &text, check_plugins)
}

/// Validates configuration text that came from `path`.
pub fn parse(path: &Path, text: &str, check_plugins: bool) -> Result<Config, ConfigErrors> {
    let file = path.display().to_string();
    let doc = text.parse::<toml_edit::Document<String>>();
    let locator = Locator {
        doc: doc.as_ref().ok().cloned(),
        text: text.to_string(),
    };
    if let Some(doc) = &locator.doc {
        let unknown = unknown_keys(doc);
        if !unknown.is_empty() {
            let problems = unknown
                .into_iter()
                .map(|(path, known)| Problem {
                    file: file.clone(),
                    line: locator.line(&path),
                    key: path_text(&path),
                    message: format!("unknown key (known here: {known})"),
                })
                .collect();
            return Err(ConfigErrors(problems));
        }
    }
    let raw: FileConfig = match toml::from_str(text) {
        Ok(r) => r,
        Err(e) => {
            let line = e.span().map(|s| locator.line_of(s.start));
            let message = e.message().to_string();
            let key = e
                .span()
                .and_then(|s| text.get(s.clone()))
                .map(|k| k.trim().trim_matches('"').to_string())
                .filter(|k| !k.contains('\n') && k.len() < 80)
                .unwrap_or_else(|| "(syntax)".to_string());
            return Err(ConfigErrors(vec![Problem {
                file,
                line,
                key,
                message,
            }]));
        }
    };
    let mut c = Collector {
        file: file.clone(),
        locator: &locator,
        problems: Vec::new(),
    };
    let base = path.parent().unwrap_or(Path::new("."));

    let listen = match raw.server.listen.parse::<SocketAddr>() {
        Ok(a) => a,
        Err(_) => {
            c.add(
                &[k("server"), k("listen")],
                format!(
                    "{:?} is not an address like 127.0.0.1:8080",
                    raw.server.listen
                ),
            );
            SocketAddr::from(([127, 0, 0, 1], 8080))
        }
    };
    if let Some(token) = &raw.server.token {
        for p in token.problems("token") {
            c.add(&[k("server"), k("token")], p);
        }
    }

    let mut names = HashSet::new();
    let mut pools = Vec::new();
    if raw.pools.is_empty() {
        c.add(&[k("pool")], "no [[pool]] defined");
    }
    for (i, p) in raw.pools.iter().enumerate() {
        let at = |key: &str| vec![k("pool"), Seg::Index(i), k(key)];
        if p.name.is_empty()
            || !p
                .name
                .chars()
                .all(|ch| ch.is_ascii_alphanumeric() || ch == '-' || ch == '_')
        {
            c.add(
                &at("name"),
                format!("{:?}: use letters, digits, '-' and '_'", p.name),
            );
        } else if !names.insert(p.name.clone()) {
            c.add(&at("name"), format!("duplicate pool name {:?}", p.name));
        }
        let relative = |s: &str| {
            if Path::new(s).is_absolute() {
                PathBuf::from(s)
            } else {
                base.join(s)
            }
        };
        let plugin = if p.plugin.starts_with("oci://") {
            let reference = match OciRef::parse(&p.plugin) {
                Ok(r) => r,
                Err(e) => {
                    c.add(&at("plugin"), e.to_string());
                    OciRef {
                        registry: String::new(),
                        repository: String::new(),
                        tag: None,
                        digest: None,
                    }
                }
            };
            let verify_key = p.verify.as_ref().map(|v| relative(&v.key));
            if let Some(key) = &verify_key {
                if !key.is_file() {
                    c.add(
                        &[k("pool"), Seg::Index(i), k("verify"), k("key")],
                        format!("{} does not exist or is not a file", key.display()),
                    );
                } else if let Err(e) = flotilla_oci::PublicKey::load(key) {
                    c.add(
                        &[k("pool"), Seg::Index(i), k("verify"), k("key")],
                        e.to_string(),
                    );
                }
            }
            PluginSource::Oci {
                reference,
                pull_policy: p.pull_policy.unwrap_or_default(),
                verify_key,
            }
        } else {
            let path = relative(&p.plugin);
            if check_plugins && !path.is_file() {
                c.add(
                    &at("plugin"),
                    format!("{} does not exist or is not a file", path.display()),
                );
            }
            if p.pull_policy.is_some() {
                c.add(&at("pull_policy"), "only applies to oci:// plugins");
            }
            if p.verify.is_some() {
                c.add(
                    &at("verify"),
                    "signatures can only be checked for oci:// plugins",
                );
            }
            PluginSource::File(path)
        };
        let capacity = positive(
            &mut c,
            &at("capacity_per_instance"),
            p.capacity_per_instance,
            1,
        );
        let max_instances = positive(&mut c, &at("max_instances"), p.max_instances, 1);
        let max_use = positive(&mut c, &at("max_use_count"), p.max_use_count, 0);
        let failure_threshold = positive(&mut c, &at("failure_threshold"), p.failure_threshold, 1);
        for (key, d) in [
            ("update_interval", p.update_interval),
            ("instance_acquire_timeout", p.instance_acquire_timeout),
            ("deletion_retry_interval", p.deletion_retry_interval),
        ] {
            if d.is_zero() {
                c.add(&at(key), "must be greater than zero");
            }
        }
        let (throttle_limit, throttle_burst) = match p.scale_throttle {
            None => (0.0, 1),
            Some(t) => {
                if !t.limit.is_finite() || t.limit <= 0.0 {
                    c.add(
                        &[k("pool"), Seg::Index(i), k("scale_throttle"), k("limit")],
                        "must be a positive number of instances per second",
                    );
                }
                let burst = positive(
                    &mut c,
                    &[k("pool"), Seg::Index(i), k("scale_throttle"), k("burst")],
                    t.burst,
                    1,
                );
                (t.limit, burst)
            }
        };
        let mut policies = Vec::new();
        for (j, pol) in p.policy.iter().enumerate() {
            let pat =
                |key: &str| vec![k("pool"), Seg::Index(i), k("policy"), Seg::Index(j), k(key)];
            let idle_count = positive(&mut c, &pat("idle_count"), pol.idle_count, 0);
            let limit = positive(
                &mut c,
                &pat("scale_factor_limit"),
                pol.scale_factor_limit,
                0,
            );
            if u64::from(idle_count) > u64::from(max_instances) * u64::from(capacity) {
                c.add(
                    &pat("idle_count"),
                    format!(
                        "{idle_count} idle slots can never be met: max_instances ({max_instances}) x capacity_per_instance ({capacity}) = {}",
                        u64::from(max_instances) * u64::from(capacity)
                    ),
                );
            }
            match Policy::new(
                pol.periods.clone(),
                &pol.timezone,
                idle_count,
                ms(pol.idle_time),
                pol.scale_factor,
                limit,
                pol.preemptive_mode,
            ) {
                Ok(policy) => policies.push(policy),
                Err(errors) => {
                    for (key, message) in errors {
                        let mut path = vec![k("pool"), Seg::Index(i), k("policy"), Seg::Index(j)];
                        match key.split_once('[') {
                            Some((name, rest)) => {
                                path.push(k(name));
                                if let Ok(n) = rest.trim_end_matches(']').parse() {
                                    path.push(Seg::Index(n));
                                }
                            }
                            None => path.push(k(&key)),
                        }
                        c.add(&path, message);
                    }
                }
            }
        }
        let allow = match AllowList::parse(&p.allowed_outbound_hosts) {
            Ok(a) => a,
            Err(errors) => {
                for e in errors {
                    let n = p
                        .allowed_outbound_hosts
                        .iter()
                        .position(|h| *h == e.entry)
                        .unwrap_or(0);
                    c.add(
                        &[
                            k("pool"),
                            Seg::Index(i),
                            k("allowed_outbound_hosts"),
                            Seg::Index(n),
                        ],
                        e.to_string(),
                    );
                }
                AllowList::default()
            }
        };
        let mut ranges = Vec::new();
        for (n, r) in p.allowed_ip_ranges.iter().enumerate() {
            match r.parse::<ipnet::IpNet>() {
                Ok(net) => ranges.push(net),
                Err(_) => c.add(
                    &[
                        k("pool"),
                        Seg::Index(i),
                        k("allowed_ip_ranges"),
                        Seg::Index(n),
                    ],
                    format!("{r:?} is not a CIDR range like 127.0.0.0/8"),
                ),
            }
        }
        let mut extra_roots = Vec::new();
        for (n, f) in p.tls_ca_files.iter().enumerate() {
            use rustls::pki_types::pem::PemObject;
            let file = if Path::new(f).is_absolute() {
                PathBuf::from(f)
            } else {
                base.join(f)
            };
            let at = vec![k("pool"), Seg::Index(i), k("tls_ca_files"), Seg::Index(n)];
            match rustls::pki_types::CertificateDer::pem_file_iter(&file) {
                Ok(certs) => {
                    let before = extra_roots.len();
                    for cert in certs {
                        match cert {
                            Ok(c) => extra_roots.push(c),
                            Err(e) => c.add(&at, format!("{}: {e}", file.display())),
                        }
                    }
                    if extra_roots.len() == before {
                        c.add(&at, format!("{}: no PEM certificate found", file.display()));
                    }
                }
                Err(e) => c.add(&at, format!("cannot read {}: {e}", file.display())),
            }
        }
        let mut credentials: Vec<Credential> = Vec::new();
        for (n, table) in p.credentials.iter().enumerate() {
            let cat = |key: &str| {
                vec![
                    k("pool"),
                    Seg::Index(i),
                    k("credentials"),
                    Seg::Index(n),
                    k(key),
                ]
            };
            let mut table = table.clone();
            let name = match table.remove("name") {
                Some(toml::Value::String(s)) if !s.is_empty() => s,
                _ => {
                    c.add(&cat("name"), "missing: every credential needs a name");
                    continue;
                }
            };
            if credentials.iter().any(|cr| cr.name == name) {
                c.add(&cat("name"), format!("duplicate credential name {name:?}"));
            }
            let hosts: Vec<String> = match table.remove("hosts") {
                Some(v) => match v.try_into() {
                    Ok(h) => h,
                    Err(_) => {
                        c.add(
                            &cat("hosts"),
                            "must be a list of scheme://host[:port] strings",
                        );
                        Vec::new()
                    }
                },
                None => Vec::new(),
            };
            if hosts.is_empty() {
                c.add(
                    &cat("hosts"),
                    "list the hosts this credential may be sent to",
                );
            }
            let bound = match AllowList::parse(&hosts) {
                Ok(a) => a,
                Err(errors) => {
                    for e in errors {
                        c.add(&cat("hosts"), e.to_string());
                    }
                    AllowList::default()
                }
            };
            match CredentialKind::deserialize(toml::Value::Table(table)) {
                Ok(kind) => {
                    let sources: Vec<(&str, &SecretSource)> = match &kind {
                        CredentialKind::Bearer { token } => vec![("token", token)],
                        CredentialKind::Basic { password, .. } => vec![("password", password)],
                        CredentialKind::Aws(chain) => {
                            let cfg = &chain.0.config;
                            if cfg.access_key_id.is_some() != cfg.secret_access_key.is_some() {
                                c.add(
                                    &cat("access_key_id"),
                                    "give both access_key_id and secret_access_key, or neither",
                                );
                            }
                            [
                                ("access_key_id", &cfg.access_key_id),
                                ("secret_access_key", &cfg.secret_access_key),
                                ("session_token", &cfg.session_token),
                            ]
                            .into_iter()
                            .filter_map(|(k, s)| s.as_ref().map(|s| (k, s)))
                            .collect()
                        }
                        CredentialKind::AwsSigv4 {
                            access_key_id,
                            secret_access_key,
                            session_token,
                            ..
                        } => {
                            let mut v = vec![
                                ("access_key_id", access_key_id),
                                ("secret_access_key", secret_access_key),
                            ];
                            if let Some(t) = session_token {
                                v.push(("session_token", t));
                            }
                            v
                        }
                    };
                    for (key, s) in sources {
                        for problem in s.problems(key) {
                            c.add(&cat(key), problem);
                        }
                    }
                    credentials.push(Credential {
                        name,
                        kind,
                        hosts: bound,
                    });
                }
                Err(e) => c.add(
                    &cat("kind"),
                    format!("{e} (kinds: bearer, basic, aws-sigv4)"),
                ),
            }
        }
        for problem in p.limits.problems() {
            c.add(&at("limits"), problem);
        }
        let settings = match serde_json::to_string(&p.plugin_config) {
            Ok(s) => s,
            Err(e) => {
                c.add(
                    &at("plugin_config"),
                    format!("cannot be expressed as JSON: {e}"),
                );
                "{}".to_string()
            }
        };
        pools.push(Pool {
            name: p.name.clone(),
            plugin,
            settings,
            scaler: ScalerConfig {
                capacity_per_instance: capacity,
                max_use_count: max_use,
                max_instances,
                throttle_limit,
                throttle_burst,
                failure_threshold,
                deletion_retry_interval_ms: ms(p.deletion_retry_interval),
                instance_acquire_timeout_ms: ms(p.instance_acquire_timeout),
                update_interval_ms: ms(p.update_interval),
            },
            policies,
            sandbox: Sandbox {
                egress: EgressPolicy {
                    allow,
                    allowed_ip_ranges: ranges,
                    resolve_overrides: p.resolve.clone(),
                    credentials,
                    extra_roots,
                    ..EgressPolicy::default()
                },
                limits: p.limits.clone(),
            },
            delete_instances_on_shutdown: p.delete_instances_on_shutdown,
        });
    }
    for (i, r) in raw.oci.insecure_registries.iter().enumerate() {
        if OciRef::parse(&format!("oci://{r}/x:y")).is_err() || r.contains('/') {
            c.add(
                &[k("oci"), k("insecure_registries"), Seg::Index(i)],
                format!("{r:?} is not a registry like host:port (no scheme, no path)"),
            );
        }
    }
    let mut oci = raw.oci.clone();
    for (i, f) in oci.tls_ca_files.iter_mut().enumerate() {
        if f.is_relative() {
            *f = base.join(&*f);
        }
        if !f.is_file() {
            c.add(
                &[k("oci"), k("tls_ca_files"), Seg::Index(i)],
                format!("{} does not exist or is not a file", f.display()),
            );
        }
    }
    if !c.problems.is_empty() {
        return Err(ConfigErrors(c.problems));
    }
    Ok(Config {
        path: path.to_path_buf(),
        listen,
        token: raw.server.token,
        shutdown_grace: raw.server.shutdown_grace,
        cache_dir: raw
            .cache_dir
            .map(|d| if d.is_absolute() { d } else { base.join(d) }),
        oci,
        pools,
    })
}
