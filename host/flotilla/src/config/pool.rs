//! `[[pool]]`: the keys users write in one table (GitLab Runner's names), handed to the room
//! that owns each: the plugin source and sandbox to the plugin runtime, credentials to the
//! credentials crate, the knobs and policies to the scaler.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;

use ipnet::IpNet;
use serde::Deserialize;

use flotilla_connector::{ConnectorConfig, ConnectorSettings};
use flotilla_credentials::config::{CredentialConfig, validate_all as validate_credentials};
use flotilla_oci::PullPolicy;
use flotilla_oci::config::VerifyConfig;
use flotilla_plugin_runtime::config::{EgressConfig, SourceConfig, sandbox};
use flotilla_plugin_runtime::loader::{Embedded, PluginSource};
use flotilla_plugin_runtime::{Limits, Sandbox};
use flotilla_scaler::config::{InPool, PolicyConfig};
use flotilla_scaler::{Policy, ScalerConfig, with_pool_knobs};
use flotilla_validate::{Context, KeyPath, Problems, Validate};

with_pool_knobs! {
    /// `[[pool]]` as written: its own keys, then the scaler's knobs (`with_pool_knobs!`).
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
        /// The pool that takes this one's waiting reservations while this one cannot grow (a
        /// quota or capacity refusal, or instances lost soon after they came: a spot pool with
        /// an on-demand fallback).
        #[serde(default)]
        pub fallback: Option<String>,
        /// Delete the pool's instances after draining on shutdown.
        #[serde(default)]
        pub delete_instances_on_shutdown: bool,
        /// The ports of the exporters on each instance that `/sd/prometheus` lists as targets
        /// (node_exporter's 9100 by default; `[]`: none).
        #[serde(default = "node_exporter_port")]
        pub exporter_ports: Vec<u16>,
        /// Egress allow-list, `scheme://host[:port]`; empty denies all.
        #[serde(default)]
        pub allowed_outbound_hosts: Vec<String>,
        /// Normally refused ranges this pool may reach (e.g. `127.0.0.0/8` for an emulator).
        #[serde(default)]
        pub allowed_ip_ranges: Vec<IpNet>,
        /// Fixed name resolution for the plugin's requests (checked like DNS answers).
        #[serde(default)]
        pub resolve: BTreeMap<String, Vec<IpAddr>>,
        /// Extra CA certificates (PEM files, relative to this file) trusted for HTTPS.
        #[serde(default)]
        pub tls_ca_files: Vec<PathBuf>,
        /// Credentials the plugin may name.
        #[serde(default)]
        pub credentials: Vec<CredentialConfig>,
        /// Plugin resource limits.
        #[serde(default)]
        pub limits: Limits,
        /// Idle policies; the last matching wins.
        #[serde(default)]
        pub policy: Vec<PolicyConfig>,
        /// How the host reaches instances before they take jobs; without it, an instance the
        /// cloud reports running is ready.
        #[serde(default)]
        pub connector: Option<ConnectorConfig>,
    }
}

impl PoolConfig {
    /// Whether the pool's connector serves a Docker handle (Docker over SSH, or docker-tls).
    pub fn serves_docker(&self) -> bool {
        self.connector
            .as_ref()
            .is_some_and(|c| c.docker || c.docker_tls.is_some())
    }
}

/// A pool ready to start.
#[derive(Debug, Clone)]
pub struct Pool {
    /// Its name.
    pub name: String,
    /// Its place among the file's `[[pool]]` tables (for located messages).
    pub index: usize,
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
    /// SSH readiness settings, when `[pool.connector]` is set.
    pub connector: Option<ConnectorSettings>,
    /// Exporter ports `/sd/prometheus` lists per instance.
    pub exporter_ports: Vec<u16>,
    /// The pool that takes its waiting reservations while it cannot grow.
    pub fallback: Option<String>,
}

fn node_exporter_port() -> Vec<u16> {
    vec![9100]
}

impl Pool {
    /// What `config check` and `run` say of a pool whose machines take jobs without Docker
    /// (instance mode: a connector with `docker = false`) and more than one job each: the
    /// jobs share the machine's login user, so one job can read or change what later jobs
    /// run. `None` when each machine serves one job, or jobs run in containers.
    pub fn shared_machine_note(&self) -> Option<String> {
        let instance_mode = self
            .connector
            .as_ref()
            .is_some_and(|c| c.docker_socket.is_none() && c.docker_tls.is_none());
        let uses = self.scaler.max_use_count;
        (instance_mode && uses != 1).then(|| {
            format!(
                "pool {}: jobs without Docker (instance mode) share each machine's login user, and max_use_count = {} lets {} jobs use one machine: a job can leave processes or files behind that read or change what later jobs on it run, their secrets included. The GitLab driver binds each machine to the first project and protection it served, so this is between jobs of one project (unless a runner passes --unsafe-share-machines-across-projects); set max_use_count = 1 unless those jobs trust each other",
                self.name,
                uses,
                if uses == 0 { "any number of".to_string() } else { uses.to_string() }
            )
        })
    }
}

/// Every pool, with unique names; at least one.
pub(super) fn validate_all(
    pools: &[PoolConfig],
    cx: &Context,
    at: &KeyPath,
    problems: &mut Problems,
) -> Option<Vec<Pool>> {
    if pools.is_empty() {
        problems.add(at, "no [[pool]] defined");
        return None;
    }
    let mut out = Vec::new();
    for (i, p) in pools.iter().enumerate() {
        let here = at.index(i);
        if pools.iter().take(i).any(|q| q.name == p.name) {
            problems.add(
                &here.key("name"),
                format!("duplicate pool name {:?}", p.name),
            );
        }
        if let Some(fallback) = &p.fallback {
            let named = pools.iter().find(|q| &q.name == fallback);
            let problem = match named {
                None => Some(format!("no pool is named {fallback:?}")),
                Some(q) if q.name == p.name => Some("a pool cannot be its own fallback".into()),
                Some(q) => q.fallback.as_ref().map(|next| {
                    format!(
                        "pool {fallback:?} has a fallback of its own ({next:?}); a fallback \
                         pool must not have one, so demand moves one step at most"
                    )
                }),
            };
            if let Some(problem) = problem {
                problems.add(&here.key("fallback"), problem);
            }
        }
        if let Some(mut pool) = p.validate(cx, &here, problems) {
            pool.index = i;
            out.push(pool);
        }
    }
    (out.len() == pools.len()).then_some(out)
}

/// What the checks after the file's validation need of one pool (see `preflight`): its plugin,
/// the settings and sandbox it is given, and its connector's files. Built even when the pool's
/// other keys have problems, so one run reports those and the plugin's verdict together.
#[derive(Debug, Clone)]
pub struct PluginParts {
    /// Where the pool sits in the file, as written (`pool[2]`).
    pub at: KeyPath,
    /// Its name.
    pub name: String,
    /// Where the plugin comes from.
    pub plugin: PluginSource,
    /// `plugin_config` as JSON text.
    pub settings: String,
    /// The pool's sandbox.
    pub sandbox: Sandbox,
    /// Its connector, when that validated.
    pub connector: Option<ConnectorSettings>,
}

/// The official plugins this binary embeds, as the plugin runtime takes them (`builtin:NAME`).
pub fn embedded() -> &'static [Embedded] {
    static EMBEDDED: std::sync::LazyLock<Vec<Embedded>> = std::sync::LazyLock::new(|| {
        flotilla_builtin::ALL
            .iter()
            .map(|b| Embedded {
                name: b.name,
                bytes: b.bytes,
            })
            .collect()
    });
    &EMBEDDED
}

impl PoolConfig {
    /// The parts of this pool the later checks need, when they validate on their own (their
    /// problems are reported by the pool's own validation, not here).
    pub(super) fn plugin_parts(&self, cx: &Context, at: KeyPath) -> Option<PluginParts> {
        let mut scratch = Problems::default();
        let plugin = SourceConfig {
            plugin: &self.plugin,
            pull_policy: self.pull_policy,
            verify: self.verify.as_ref(),
            embedded: embedded(),
        }
        .validate(cx, &at, &mut scratch)?;
        let sandbox = self.sandbox(cx, &at, &mut scratch)?;
        let settings = serde_json::to_string(&self.plugin_config).ok()?;
        let connector = self
            .connector
            .as_ref()
            .and_then(|c| c.validate(cx, &at.key("connector"), &mut scratch));
        Some(PluginParts {
            at,
            name: self.name.clone(),
            plugin,
            settings,
            sandbox,
            connector,
        })
    }

    fn policies(&self, cx: &Context, at: &KeyPath, problems: &mut Problems) -> Option<Vec<Policy>> {
        // Checked against the smallest valid ceiling when a knob is itself invalid (reported
        // on its own), so a policy problem is not hidden behind a knob problem.
        let max_slots = Some(
            u64::from(self.max_instances.max(1)) * u64::from(self.capacity_per_instance.max(1)),
        );
        let checked: Vec<Option<Policy>> = self
            .policy
            .iter()
            .enumerate()
            .map(|(j, policy)| {
                InPool { policy, max_slots }.validate(cx, &at.key("policy").index(j), problems)
            })
            .collect();
        checked.into_iter().collect()
    }

    fn sandbox(&self, cx: &Context, at: &KeyPath, problems: &mut Problems) -> Option<Sandbox> {
        let credentials =
            validate_credentials(&self.credentials, cx, &at.key("credentials"), problems);
        let egress = EgressConfig {
            allowed_outbound_hosts: &self.allowed_outbound_hosts,
            allowed_ip_ranges: &self.allowed_ip_ranges,
            resolve: &self.resolve,
            tls_ca_files: &self.tls_ca_files,
            credentials: credentials.clone().unwrap_or_default(),
        }
        .validate(cx, at, problems);
        let limits = self.limits.validate(cx, &at.key("limits"), problems);
        credentials?;
        sandbox(egress, limits)
    }
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|ch| ch.is_ascii_alphanumeric() || ch == '-' || ch == '_')
}

impl Validate for PoolConfig {
    type Output = Pool;

    fn validate(&self, cx: &Context, at: &KeyPath, problems: &mut Problems) -> Option<Pool> {
        let named = valid_name(&self.name);
        if !named {
            problems.add(
                &at.key("name"),
                format!("{:?}: use letters, digits, '-' and '_'", self.name),
            );
        }
        let plugin = SourceConfig {
            plugin: &self.plugin,
            pull_policy: self.pull_policy,
            verify: self.verify.as_ref(),
            embedded: embedded(),
        }
        .validate(cx, at, problems);
        let scaler = self.knobs().validate(cx, at, problems);
        let policies = self.policies(cx, at, problems);
        let sandbox = self.sandbox(cx, at, problems);
        let connector = match &self.connector {
            Some(c) => c.validate(cx, &at.key("connector"), problems).map(Some),
            None => Some(None),
        };
        let settings = serde_json::to_string(&self.plugin_config)
            .map_err(|e| {
                problems.add(
                    &at.key("plugin_config"),
                    format!("cannot be expressed as JSON: {e}"),
                );
            })
            .ok();
        let mut ports_ok = true;
        for (i, port) in self.exporter_ports.iter().enumerate() {
            if *port == 0 || self.exporter_ports.iter().take(i).any(|p| p == port) {
                problems.add(
                    &at.key("exporter_ports").index(i),
                    format!("{port}: a port must be 1-65535 and listed once"),
                );
                ports_ok = false;
            }
        }
        if !named || !ports_ok {
            return None;
        }
        Some(Pool {
            name: self.name.clone(),
            index: 0,
            plugin: plugin?,
            settings: settings?,
            scaler: scaler?,
            policies: policies?,
            sandbox: sandbox?,
            delete_instances_on_shutdown: self.delete_instances_on_shutdown,
            connector: connector?,
            exporter_ports: self.exporter_ports.clone(),
            fallback: self.fallback.clone(),
        })
    }
}

#[cfg(test)]
#[allow(clippy::expect_used, clippy::indexing_slicing)]
mod tests {
    use std::path::Path;

    use flotilla_scaler::ScalerConfig;

    /// A pool that writes only what it must runs with the scaler's own defaults: the serde
    /// defaults are read from there, not written again.
    #[test]
    fn a_pool_that_leaves_the_knobs_out_gets_the_scalers_defaults() {
        let text = "[server]\nlisten = \"127.0.0.1:0\"\n\n[[pool]]\nname = \"p\"\n\
                    plugin = \"builtin:static\"\nmax_instances = 3\n";
        let cfg = crate::config::parse(Path::new("t.toml"), text, false).expect("valid");
        let want = ScalerConfig {
            max_instances: 3,
            ..ScalerConfig::default()
        };
        assert_eq!(cfg.pools[0].scaler, want);
    }

    /// Every knob written in `[[pool]]` reaches the scaler: the table's knob keys are the
    /// scaler's own list (`with_pool_knobs!`), and a misspelt one is refused with its line and
    /// the key it meant.
    #[test]
    fn every_knob_of_a_pool_reaches_the_scaler() {
        let text = "[server]\nlisten = \"127.0.0.1:0\"\n\n[[pool]]\nname = \"p\"\n\
                    plugin = \"builtin:static\"\nmax_instances = 3\ncapacity_per_instance = 2\n\
                    max_use_count = 5\ninstance_acquire_timeout = \"7s\"\n\
                    update_interval = \"11s\"\nupdate_interval_when_expecting = \"3s\"\n\
                    deletion_retry_interval = \"13s\"\nfailure_threshold = 4\n\
                    instance_ready_grace = \"17s\"\nlease_ttl = \"19s\"\n\
                    max_job_duration = \"23s\"\npaused_retry_interval = \"29s\"\n\
                    scale_throttle = { limit = 0.5, burst = 2 }\nfallback_hold = \"31s\"\n\
                    fallback_failing_within = \"37s\"\n";
        let cfg = crate::config::parse(Path::new("t.toml"), text, false).expect("valid");
        // Every field, so a knob the scaler gains must be written here too.
        let want = ScalerConfig {
            capacity_per_instance: 2,
            max_use_count: 5,
            max_instances: 3,
            throttle_limit: 0.5,
            throttle_burst: 2,
            failure_threshold: 4,
            deletion_retry_interval_ms: 13_000,
            instance_acquire_timeout_ms: 7_000,
            update_interval_ms: 11_000,
            update_interval_when_expecting_ms: 3_000,
            instance_ready_grace_ms: 17_000,
            lease_ttl_ms: Some(19_000),
            max_job_duration_ms: Some(23_000),
            paused_retry_interval_ms: 29_000,
            fallback_hold_ms: 31_000,
            fallback_failing_within_ms: 37_000,
        };
        assert_eq!(cfg.pools[0].scaler, want);

        let typo = text.replace("failure_threshold", "failure_treshold");
        let errors = crate::config::parse(Path::new("t.toml"), &typo, false)
            .expect_err("refused")
            .to_string();
        assert!(
            errors.contains(
                "t.toml:14: pool[0].failure_treshold: unknown key; did you mean `failure_threshold`?"
            ),
            "{errors}"
        );
    }

    /// `[[server.operator]]`: a name the log can carry, once each, and `server.token` beside
    /// them; each problem names its line and key.
    #[test]
    fn operators_need_good_unique_names_and_the_api_token() {
        let pool = "\n[[pool]]\nname = \"p\"\nplugin = \"builtin:static\"\nmax_instances = 1\n";
        let ok = format!(
            "[server]\ntoken = {{ value = \"t\" }}\n\n[[server.operator]]\nname = \"alice@example.com\"\ntoken = {{ value = \"a\" }}\n{pool}"
        );
        let cfg = crate::config::parse(Path::new("t.toml"), &ok, false).expect("valid");
        assert_eq!(cfg.operators.len(), 1);
        assert_eq!(cfg.operators[0].0, "alice@example.com");

        let bad = format!(
            "[server]\ntoken = {{ value = \"t\" }}\n\n[[server.operator]]\nname = \"alice\"\ntoken = {{ value = \"a\" }}\n\n[[server.operator]]\nname = \"alice\"\ntoken = {{ value = \"b\" }}\n\n[[server.operator]]\nname = \"al ice\"\ntoken = {{ value = \"c\" }}\n{pool}"
        );
        let errors = crate::config::parse(Path::new("t.toml"), &bad, false)
            .expect_err("refused")
            .to_string();
        assert!(
            errors.contains(
                "t.toml:9: server.operator[1].name: \"alice\" names another operator too"
            ),
            "{errors}"
        );
        assert!(
            errors.contains("t.toml:13: server.operator[2].name: \"al ice\" is not a name"),
            "{errors}"
        );

        let open = format!(
            "[server]\n\n[[server.operator]]\nname = \"alice\"\ntoken = {{ value = \"a\" }}\n{pool}"
        );
        let errors = crate::config::parse(Path::new("t.toml"), &open, false)
            .expect_err("refused")
            .to_string();
        assert!(
            errors.contains("server.operator: needs server.token"),
            "{errors}"
        );
    }
}
