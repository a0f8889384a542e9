//! The walk over one runner: its `[runners.machine]` table becomes a pool (size, growth,
//! the connector), and its driver's options the cloud group the pool's plugin manages.

use super::*;

impl Runner<'_> {
    pub(super) fn item(&self, path: &KeyPath, reason: impl Into<String>) -> Item {
        Item {
            key: display(path),
            line: self.locator.line(path.segments()),
            reason: reason.into(),
        }
    }

    pub(super) fn refuse(&mut self, path: &KeyPath, reason: impl Into<String>) {
        let item = self.item(path, reason);
        self.report.refused.push(item);
    }

    pub(super) fn changed(&mut self, path: &KeyPath, reason: impl Into<String>) {
        let item = self.item(path, reason);
        self.report.changed.push(item);
    }

    pub(super) fn unmapped(&mut self, path: &KeyPath, reason: impl Into<String>) {
        let item = self.item(path, reason);
        self.report.unmapped.push(item);
    }

    /// The driver's own options (`PREFIX-name` as `(name, its last value, where)`), after
    /// reporting every other option as unmapped: Docker Engine and swarm options belong in
    /// `engine_home` (the cloud's image or start-up script), anything else is not the driver's.
    pub(super) fn driver_options<'o>(
        &mut self,
        opts: &'o DriverOptions,
        prefix: &str,
        engine_home: &str,
    ) -> Vec<(&'o str, &'o String, KeyPath)> {
        let mut out = Vec::new();
        for (key, values) in opts {
            let Some(name) = key.strip_prefix(prefix) else {
                for (_, at) in values {
                    let reason = if key.starts_with("engine-") || key.starts_with("swarm") {
                        format!(
                            "Flotilla does not install or configure Docker Engine: put it in {engine_home}"
                        )
                    } else {
                        format!(
                            "not an option of the {} driver",
                            prefix.trim_end_matches('-')
                        )
                    };
                    self.unmapped(&with_option(at, key), reason);
                }
                continue;
            };
            if let Some((value, at)) = values.last() {
                out.push((name, value, with_option(at, key)));
            }
        }
        out
    }

    /// The pool's TOML, or `None` with the reasons in `refused`.
    pub(super) fn pool(
        &mut self,
        runner: &toml::Value,
        name: &str,
        concurrent: Option<u32>,
        options: &Options,
    ) -> Option<String> {
        let machine_at = self.at.key("machine");
        let empty = toml::Table::new();
        let machine = match runner.get("machine") {
            Some(toml::Value::Table(t)) => t,
            Some(_) => {
                self.refuse(&machine_at, "must be a table");
                &empty
            }
            None => {
                self.refuse(&machine_at, "missing: a docker+machine runner needs it");
                &empty
            }
        };
        self.unmapped_runner_keys(runner, machine, &machine_at);
        let max_instances = self.max_instances(runner, concurrent, options);
        let max_use = self.uint(machine, &machine_at, "MaxBuilds").unwrap_or(0);
        let throttle = self.growth_rate(machine, &machine_at);
        let policies = self.policies(machine, &machine_at, options);
        let cloud = self.cloud(
            machine,
            &machine_at,
            name,
            max_instances.unwrap_or(0),
            options,
        );
        if !self.report.refused.is_empty() {
            return None;
        }
        let (cloud, plugin_config, plugin) = cloud?;
        let max_instances = max_instances?;
        let mut s = String::new();
        let _ = writeln!(s, "\n# From runner {:?}.", self.report.runner);
        let _ = writeln!(s, "[[pool]]");
        let _ = writeln!(s, "name = {}", quote(name));
        let _ = writeln!(s, "plugin = {}", quote(&plugin));
        let _ = writeln!(s, "capacity_per_instance = 1");
        let _ = writeln!(s, "max_instances = {max_instances}");
        if max_use > 0 {
            let _ = writeln!(s, "max_use_count = {max_use}");
        }
        if let Some((limit, burst)) = throttle {
            let _ = writeln!(
                s,
                "scale_throttle = {{ limit = {limit:?}, burst = {burst} }}"
            );
        }
        s.push_str(&cloud);
        s.push_str(&plugin_config);
        for p in policies {
            s.push_str(&p);
        }
        Some(s)
    }

    /// Reports the machine section's keys this migration does not carry over, and the
    /// runner's own that stay with GitLab Runner.
    pub(super) fn unmapped_runner_keys(
        &mut self,
        runner: &toml::Value,
        machine: &toml::Table,
        machine_at: &KeyPath,
    ) {
        for key in machine.keys() {
            if !MAPPED_MACHINE_KEYS.contains(&key.as_str()) {
                let reason = match key.as_str() {
                    "MachineName" => {
                        "instances are named by the cloud group (its launch or instance template), not by Flotilla"
                    }
                    k if k.starts_with("OffPeak") => {
                        "OffPeak settings are deprecated (removed in GitLab Runner 14.0): rewrite them as a [[runners.machine.autoscaling]] section and migrate again"
                    }
                    _ => "not a key this migration knows",
                };
                self.unmapped(&machine_at.key(key), reason);
            }
        }
        for key in ["docker", "cache", "custom_build_dir"] {
            if runner.get(key).is_some() {
                self.unmapped(
                    &self.at.key(key),
                    "stays with GitLab Runner: the [[runners]] block this migration prints runs jobs through `flotilla gitlab` (docs/gitlab.md); [runners.docker] image becomes --default-image, its other keys are not carried over",
                );
            }
        }
    }

    /// The pool's policies: the machine section's own, then one per autoscaling section.
    pub(super) fn policies(
        &mut self,
        machine: &toml::Table,
        machine_at: &KeyPath,
        options: &Options,
    ) -> Vec<String> {
        let mut policies = Vec::new();
        if let Some(p) = self.policy(machine, machine_at, false, options) {
            policies.push(p);
        }
        if let Some(sections) = machine.get("autoscaling") {
            let list = sections.as_array().map(Vec::as_slice).unwrap_or_default();
            if list.is_empty() && !sections.is_array() {
                self.refuse(&machine_at.key("autoscaling"), "must be an array of tables");
            }
            for (i, section) in list.iter().enumerate() {
                let at = machine_at.key("autoscaling").index(i);
                match section.as_table() {
                    Some(t) => {
                        if let Some(p) = self.policy(t, &at, true, options) {
                            policies.push(p);
                        }
                    }
                    None => self.refuse(&at, "must be a table"),
                }
            }
        }
        policies
    }

    pub(super) fn max_instances(
        &mut self,
        runner: &toml::Value,
        concurrent: Option<u32>,
        options: &Options,
    ) -> Option<u32> {
        let at = self.at.key("limit");
        let limit = match runner.get("limit") {
            None => 0,
            Some(v) => match v.as_integer().and_then(|l| u32::try_from(l).ok()) {
                Some(l) => l,
                None => {
                    self.refuse(&at, "must be a whole number ≥ 0");
                    return None;
                }
            },
        };
        if limit > 0 {
            return Some(limit);
        }
        if let Some(n) = options.max_instances {
            self.changed(
                &at,
                format!("limit 0 means unlimited; Flotilla needs a bound: max_instances = {n} (--max-instances)"),
            );
            return Some(n);
        }
        if let Some(c) = concurrent {
            self.changed(
                &at,
                format!(
                    "limit 0 means unlimited; bounded by the global concurrent: max_instances = {c}"
                ),
            );
            return Some(c);
        }
        self.refuse(
            &at,
            "limit is 0 (unlimited) and concurrent is unset: pass --max-instances",
        );
        None
    }

    /// `MaxGrowthRate` (machines being created at once) as a token bucket: a burst of that
    /// many, refilled at that many a minute.
    pub(super) fn growth_rate(
        &mut self,
        machine: &toml::Table,
        at: &KeyPath,
    ) -> Option<(f64, u32)> {
        let rate = self.uint(machine, at, "MaxGrowthRate").filter(|r| *r > 0)?;
        let limit = (f64::from(rate) / 60.0 * 1000.0).round() / 1000.0;
        self.changed(
            &at.key("MaxGrowthRate"),
            format!(
                "at most {rate} machines being created at once becomes a bucket of {rate} creations refilled at {rate} a minute (limit = {limit}/s): Flotilla limits the rate of creation, not the creations in flight"
            ),
        );
        Some((limit, rate))
    }

    pub(super) fn uint(&mut self, table: &toml::Table, at: &KeyPath, key: &str) -> Option<u32> {
        let v = table.get(key)?;
        match v.as_integer().and_then(|n| u32::try_from(n).ok()) {
            Some(n) => Some(n),
            None => {
                self.refuse(&at.key(key), "must be a whole number ≥ 0");
                None
            }
        }
    }

    pub(super) fn float(&mut self, table: &toml::Table, at: &KeyPath, key: &str) -> Option<f64> {
        let v = table.get(key)?;
        match v
            .as_float()
            .or_else(|| v.as_integer().map(|i| i as f64))
            .filter(|f| f.is_finite() && *f >= 0.0)
        {
            Some(f) => Some(f),
            None => {
                self.refuse(&at.key(key), "must be a number ≥ 0");
                None
            }
        }
    }

    /// The plugin's sandbox keys and settings, and the group spec; `None` when refused.
    pub(super) fn cloud(
        &mut self,
        machine: &toml::Table,
        at: &KeyPath,
        pool: &str,
        max: u32,
        options: &Options,
    ) -> Option<(String, String, String)> {
        let driver = machine
            .get("MachineDriver")
            .and_then(toml::Value::as_str)
            .unwrap_or("");
        let mut opts = BTreeMap::new();
        let empty = Vec::new();
        let list = machine
            .get("MachineOptions")
            .and_then(toml::Value::as_array)
            .unwrap_or(&empty);
        for (i, o) in list.iter().enumerate() {
            let o_at = at.key("MachineOptions").index(i);
            match o.as_str().map(|o| o.split_once('=').unwrap_or((o, ""))) {
                Some((k, v)) => {
                    opts.entry(k.to_string())
                        .or_insert_with(Vec::new)
                        .push((v.to_string(), o_at));
                }
                None => self.refuse(&o_at, "must be a string"),
            }
        }
        let (user_option, default_user, port_option) = match driver {
            "amazonec2" => ("amazonec2-ssh-user", "ubuntu", Some("amazonec2-ssh-port")),
            "google" => ("google-username", "docker-user", None),
            _ => ("azure-ssh-user", "docker-user", None),
        };
        let user = option(&opts, "", user_option).unwrap_or_else(|| default_user.to_string());
        let port = port_option.and_then(|o| option(&opts, "", o));
        let port = match port.as_deref().map(str::parse::<u16>) {
            Some(Ok(p)) if p > 0 => Some(p),
            Some(_) => {
                self.refuse(
                    &with_option(&at.key("MachineOptions"), port_option.unwrap_or_default()),
                    "must be a port, 1-65535",
                );
                None
            }
            None => None,
        };
        let connector = format!(
            "\n# Readiness over SSH, and the Docker handle GitLab jobs run through: the user and port\n# Docker Machine logged in with. Install the pool's public key on the image (the log\n# prints it at start), or let the plugin do it.\n[pool.connector]\nusername = {}\n{}docker = true\n",
            quote(&user),
            port.map(|p| format!("port = {p}\n")).unwrap_or_default()
        );
        let machine_at = at.key("MachineOptions");
        let found = match driver {
            "amazonec2" => Some(self.aws(&opts, &machine_at, pool, max)),
            "google" => Some(self.gcp(&opts, &machine_at, pool, max)),
            "azure" => Some(self.azure(&opts, &machine_at, pool, max)),
            "" => {
                self.refuse(&at.key("MachineDriver"), "missing");
                None
            }
            other => {
                self.refuse(
                    &at.key("MachineDriver"),
                    format!("{other:?} has no Flotilla plugin (amazonec2 → aws, google → gcp, azure → azure)"),
                );
                None
            }
        };
        found.map(|cloud| {
            // The plugin given with `--plugin`, or the official one built into the binary.
            let plugin = options
                .plugins
                .get(&cloud.group.cloud)
                .cloned()
                .unwrap_or_else(|| format!("builtin:{}", cloud.group.cloud));
            self.report.group = Some(cloud.group);
            (cloud.sandbox + &connector, cloud.settings, plugin)
        })
    }
}
