//! `flotilla gitlab snippet`: the `[[runners]]` block for these flags, with the runner's
//! `limit` from the pool's capacity.

use super::*;

impl Args {
    /// Docker mode's own flags as given, for the snippet.
    pub(super) fn docker_flags(&self) -> Vec<String> {
        let mut flags = Vec::new();
        let mut one = |flag: &str, value: Option<String>| {
            if let Some(value) = value {
                flags.extend([flag.to_string(), value]);
            }
        };
        one("--helper-image", self.helper_image.clone());
        one(
            "--helper-registry-auth",
            self.helper_registry_auth
                .as_ref()
                .map(|p| p.display().to_string()),
        );
        one("--shm-size", self.shm_size.map(|b| b.to_string()));
        for (flag, values) in [
            ("--allowed-images", &self.allowed_images),
            ("--allowed-services", &self.allowed_services),
        ] {
            one(flag, (!values.is_empty()).then(|| values.join(",")));
        }
        for (flag, values) in [
            ("--volume", &self.volumes),
            ("--device", &self.devices),
            ("--extra-host", &self.extra_hosts),
            ("--dns", &self.dns),
        ] {
            for value in values {
                one(flag, Some(value.clone()));
            }
        }
        if self.privileged {
            flags.push("--privileged".into());
        }
        flags
    }

    /// The runner's `limit` and `request_concurrency`: the pool's slots (`--limit`, or
    /// `max_instances × capacity_per_instance` as the running flotilla says), so the runner
    /// takes no job the fleet cannot run (the Custom executor fetches a job before `prepare`
    /// can refuse it); a comment that says what to set when neither is known.
    pub(super) async fn limit_lines(&self) -> String {
        let slots = match self.limit {
            Some(n) => Ok((n, "--limit".to_string())),
            None => match self.api() {
                Ok(api) => api
                    .pool_slots()
                    .await
                    .map(|n| {
                        (
                            n,
                            "the pool's max_instances × capacity_per_instance, as flotilla says"
                                .to_string(),
                        )
                    })
                    .map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            },
        };
        match slots {
            Ok((n, from)) => {
                let concurrency = (n / 10).clamp(1, 10);
                format!(
                    "  limit = {n}   # {from}: the runner takes no job the fleet cannot run\n  request_concurrency = {concurrency}   # job requests in flight at once (a tenth of the slots, 1 to 10): a burst fills the fleet in seconds, not one job per poll\n"
                )
            }
            Err(why) => {
                let why: String = why.chars().filter(|c| !c.is_control()).take(200).collect();
                format!(
                    "  # limit = N   # set N to the pool's max_instances × capacity_per_instance (flotilla could not be asked: {why}); without it the runner takes up to `concurrent` jobs, and those the fleet cannot run wait in prepare\n"
                )
            }
        }
    }

    /// The `[[runners]]` block: executor custom, the four stages with these flags.
    pub(super) fn snippet(&self, limit: &str) -> anyhow::Result<String> {
        let url =
            env_or(&self.url, "FLOTILLA_URL").unwrap_or_else(|| "http://127.0.0.1:8080".into());
        let pool = env_or(&self.pool, "FLOTILLA_POOL").unwrap_or_else(|| "POOL".into());
        // The stages will refuse what this block would pass them: say so now.
        let has_token = self.token_file.is_some()
            || std::env::var_os("FLOTILLA_TOKEN_FILE").is_some()
            || std::env::var_os("FLOTILLA_TOKEN").is_some_and(|t| !t.is_empty());
        ApiClient::with_transport(&url, has_token.then(String::new), &pool, &self.transport())?;
        let mut common = self.common_flags(url, pool.clone());
        let (builds, cache, shell, helper) = self.mode_flags(&mut common)?;
        self.connection_flags(&mut common);
        Ok(format!(
            r#"[[runners]]
  name = "flotilla-{pool}"
  url = "https://gitlab.example.com"   # your GitLab
  token = "glrt-REPLACE-ME"            # the runner's authentication token
  executor = "custom"
{limit}  builds_dir = {builds}{per_job}
  cache_dir = {cache}{per_project}
{helper}{shell}{custom}"#,
            builds = serde_json::to_string(&builds)?,
            cache = serde_json::to_string(&cache)?,
            per_job = if shell.is_some() {
                "   # config answers each job's own directory"
            } else {
                ""
            },
            per_project = if shell.is_some() {
                "   # config answers each project's own (protected refs apart)"
            } else {
                ""
            },
            shell = shell.map_or(String::new(), |s| format!("  shell = \"{s}\"\n")),
            custom = crate::custom_executor::custom_section(
                &crate::custom_executor::driver_exe(),
                &common,
                self.acquire_timeout,
            )?,
        ))
    }

    /// The flags every stage gets whatever the mode: where the API is, the pool, the
    /// timeouts and the job container's limits.
    pub(super) fn common_flags(&self, url: String, pool: String) -> Vec<String> {
        let mut common = vec![
            "--url".to_string(),
            url,
            "--pool".into(),
            pool.clone(),
            "--pull-policy".into(),
            self.pull_policy.name().to_string(),
            "--acquire-timeout".into(),
            humantime::format_duration(self.acquire_timeout).to_string(),
            "--restart-window".into(),
            humantime::format_duration(self.restart_window).to_string(),
        ];
        for (flag, value) in [
            ("--memory", self.memory.map(|m| m.to_string())),
            ("--cpus", self.cpus.map(|c| format!("{}", c as f64 / 1e9))),
            ("--pids-limit", self.pids_limit.map(|p| p.to_string())),
        ] {
            if let Some(value) = value {
                common.extend([flag.to_string(), value]);
            }
        }
        if self.unsafe_job_identity_from_variables {
            common.push("--unsafe-job-identity-from-variables".into());
        }
        common
    }

    /// The mode's flags on `common`, and what the block says for it: the builds and cache
    /// directories, the shell (instance mode), and a comment on where checkout runs.
    pub(super) fn mode_flags(
        &self,
        common: &mut Vec<String>,
    ) -> anyhow::Result<(String, String, Option<&'static str>, String)> {
        let helper: String;
        let (builds, cache, shell) = match self.mode()? {
            Mode::Docker(_) => {
                common.extend(self.docker_flags());
                let image = self.helper_image.clone().unwrap_or_else(|| {
                    format!(
                        "{}:<arch>-v<runner version>",
                        flotilla_gitlab::docker::helper::GITLAB_HELPER
                    )
                });
                helper = format!(
                    "  # checkout, cache and artifacts run in the helper image {image} (--helper-image)\n"
                );
                (self.builds_dir.clone(), self.cache_dir.clone(), None)
            }
            Mode::Instance(instance) => {
                // Images are Docker mode's: no pull policy here.
                if let Some(at) = common.iter().position(|a| a == "--pull-policy") {
                    common.drain(at..at + 2);
                }
                common.extend([
                    "--mode".into(),
                    "instance".into(),
                    "--os".into(),
                    instance.os.name().into(),
                    "--shell".into(),
                    instance.shell.name().into(),
                    "--machine-dir".into(),
                    instance.dir.clone(),
                ]);
                if instance.shared_across_projects {
                    common.push("--unsafe-share-machines-across-projects".into());
                    helper = "  # instance mode, UNSAFE (--unsafe-share-machines-across-projects): jobs of every project\n  # share each machine and its login user; unless the pool sets max_use_count = 1, a job can\n  # read later jobs' scripts and secrets and leave code they run\n".to_string();
                } else {
                    helper = "  # instance mode: each machine serves the first project and protection it ran a job for,\n  # for its life; jobs of that project share its login user, so unless the pool sets\n  # max_use_count = 1, a job can read or change what later jobs of its project run there\n".to_string();
                }
                // The runner requires both; `config` answers each job's own.
                (
                    instance.builds_dir("JOB"),
                    instance.cache_dir("PROJECT", false),
                    Some(instance.shell.name()),
                )
            }
        };
        Ok((builds, cache, shell, helper))
    }

    /// How the stages reach the API: token, CA, plain HTTP; the state directory and the
    /// default image.
    pub(super) fn connection_flags(&self, common: &mut Vec<String>) {
        if let Some(f) = &self.token_file {
            common.extend(["--token-file".into(), f.display().to_string()]);
        }
        if let Some(f) = &self.ca_file {
            common.extend(["--ca-file".into(), f.display().to_string()]);
        }
        if self.insecure_http {
            common.push("--insecure-http".into());
        }
        if let Some(dir) = &self.state_dir {
            common.extend(["--state-dir".into(), dir.display().to_string()]);
        }
        if let Some(image) = &self.default_image {
            common.extend(["--default-image".into(), image.clone()]);
        }
    }
}
