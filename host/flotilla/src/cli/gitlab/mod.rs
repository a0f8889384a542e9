//! `flotilla gitlab config|prepare|run|cleanup|snippet`: GitLab Runner's Custom executor
//! driver (the `flotilla-gitlab` crate), configured by flags or `FLOTILLA_URL`,
//! `FLOTILLA_POOL`, `FLOTILLA_TOKEN_FILE` / `FLOTILLA_TOKEN`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Subcommand;

mod named;
mod snippet;
mod terminal;

use named::Named;

use terminal::terminal;

use flotilla_gitlab::{
    ApiClient, CacheBounds, ContainerOptions, DockerSettings, DriverSettings, InstanceSettings,
    Job, JobLimits, MachineOs, Mode, Outcome, PullPolicy, Shell,
};

/// The driver's flags, then the stage.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The lease API of the running `flotilla run` [env: FLOTILLA_URL; default
    /// http://127.0.0.1:8080].
    #[arg(long)]
    url: Option<String>,
    /// The pool to take instances from [env: FLOTILLA_POOL].
    #[arg(long)]
    pool: Option<String>,
    /// A file holding the API token [env: FLOTILLA_TOKEN_FILE; or the token in FLOTILLA_TOKEN].
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// PEM CA certificates that sign the API's certificate, for an `https://` URL [env:
    /// FLOTILLA_CA_FILE; default: the public web roots].
    #[arg(long)]
    ca_file: Option<PathBuf>,
    /// `snippet`: the runner's `limit` (the jobs it runs at once) [default: the pool's
    /// `max_instances × capacity_per_instance`, asked from flotilla].
    #[arg(long)]
    limit: Option<u32>,
    /// Instance mode, UNSAFE: let a machine that ran a job of one project (or one protection)
    /// run jobs of others. They share the login user: a job can read later jobs' scripts and
    /// secrets, and leave code they run. Without it, each machine serves the first project
    /// and protection it ran for, for its life.
    #[arg(long)]
    unsafe_share_machines_across_projects: bool,
    /// Send the API token over plain HTTP to a non-loopback URL. The token opens a shell and
    /// Docker on every machine, and instance-mode scripts cross this connection: only for a
    /// network that is yours alone; prefer TLS (`[server] tls`).
    #[arg(long)]
    insecure_http: bool,
    /// Where jobs run: `docker` (each job in a container on the instance) or `instance`
    /// (each job directly on the machine over SSH: macOS, Windows, one VM per job).
    #[arg(long, value_enum, default_value_t = ModeFlag::Docker)]
    mode: ModeFlag,
    /// Instance mode: the machines' system, `linux`, `macos`, `freebsd` or `windows`. It
    /// decides paths and commands; `prepare` fails a job whose machine reports another.
    #[arg(long, default_value = "linux", value_parser = Named::new(MachineOs::NAMES, MachineOs::parse))]
    os: MachineOs,
    /// Instance mode: the shell the runner writes scripts for, `bash` (Linux, macOS) or
    /// `pwsh` / `powershell` (Windows) [default: bash, or pwsh on Windows].
    #[arg(long, value_parser = Named::new(Shell::NAMES, Shell::parse))]
    shell: Option<Shell>,
    /// Instance mode: the directory on each machine under which every job gets its own
    /// [default: /var/tmp/flotilla, or C:\flotilla on Windows].
    #[arg(long)]
    machine_dir: Option<String>,
    /// The runner's `builds_dir`, inside the job container.
    #[arg(long, default_value = "/builds")]
    builds_dir: String,
    /// The runner's `cache_dir`, inside the job container (a volume kept on the instance).
    #[arg(long, default_value = "/cache")]
    cache_dir: String,
    /// The image of jobs that name none.
    #[arg(long)]
    default_image: Option<String>,
    /// When to pull images: always (the default: the registry checks every job's
    /// credentials), if-not-present (faster, but a job can then run a private image another
    /// job pulled, without credentials) or never.
    #[arg(long, default_value = "always", value_parser = Named::new(PullPolicy::NAMES, PullPolicy::parse))]
    pull_policy: PullPolicy,
    /// How long `prepare` waits for an instance (and any stage for a pool that is starting).
    #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
    acquire_timeout: Duration,
    /// How long a stage waits for a flotilla that does not answer at all (a restart, an
    /// upgrade) before it fails the job as a system failure.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    restart_window: Duration,
    /// Memory of each job and service container, e.g. `2g` or `512m` (Docker's --memory).
    #[arg(long, value_parser = parse_bytes)]
    memory: Option<i64>,
    /// CPUs of each job and service container, e.g. `1.5` (Docker's --cpus).
    #[arg(long, value_parser = parse_cpus)]
    cpus: Option<i64>,
    /// Processes of each job and service container (Docker's --pids-limit).
    #[arg(long)]
    pids_limit: Option<u32>,
    /// The helper image: git and GitLab Runner's helper binary, where checkout, cache and
    /// artifacts run (one container per job) [default: GitLab's official
    /// registry.gitlab.com/gitlab-org/gitlab-runner/gitlab-runner-helper:<arch>-v<runner
    /// version>]. Pin it by digest, or name a mirror, for machines without registry access;
    /// `none`: no helper, every stage in the job's image (which then needs git and
    /// gitlab-runner, as the bare Custom executor does).
    #[arg(long)]
    helper_image: Option<String>,
    /// A Docker config.json (`{"auths": {...}}`) with the registry credentials to pull the
    /// helper image with; never a job's credentials.
    #[arg(long)]
    helper_registry_auth: Option<PathBuf>,
    /// Run the job's, helper and service containers privileged (for a `docker:dind`
    /// service). The pool must allow it too (`allow_privileged` in `[pool.connector]`).
    #[arg(long)]
    privileged: bool,
    /// Images jobs may run, as globs (`ruby:*`, `registry.example.com/**`); repeat or
    /// separate with commas. None: any image.
    #[arg(long, value_delimiter = ',')]
    allowed_images: Vec<String>,
    /// Images jobs may start as services, as globs; none: any.
    #[arg(long, value_delimiter = ',')]
    allowed_services: Vec<String>,
    /// An extra volume of every container of the job: `/path` or `source:/path[:ro]`
    /// (repeat for more).
    #[arg(long = "volume")]
    volumes: Vec<String>,
    /// Size of /dev/shm, e.g. `256m` (Docker's --shm-size).
    #[arg(long, value_parser = parse_bytes)]
    shm_size: Option<i64>,
    /// A host device for every container of the job: `/dev/x[:/dev/y[:rwm]]` (repeat).
    #[arg(long = "device")]
    devices: Vec<String>,
    /// An extra /etc/hosts line `host:ip` for every container of the job (repeat).
    #[arg(long = "extra-host")]
    extra_hosts: Vec<String>,
    /// A DNS server for every container of the job (repeat).
    #[arg(long = "dns")]
    dns: Vec<String>,
    /// A project's cache volume older than this is removed (when no job uses it).
    #[arg(long, default_value = "7days", value_parser = humantime::parse_duration)]
    cache_max_age: Duration,
    /// Cache volumes kept per instance (one per project, and per protected project); the
    /// oldest unused ones go first.
    #[arg(long, default_value_t = 64)]
    cache_max_volumes: usize,
    /// The driver's own directory on the manager: a cleanup that cannot reach flotilla
    /// within the restart window is queued here, and the next driver call that reaches it
    /// finishes the cleanup [env: FLOTILLA_DRIVER_STATE_DIR; default
    /// $XDG_STATE_HOME/flotilla/gitlab or ~/.local/state/flotilla/gitlab].
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// Added to the job's own timeout (GitLab sends it to the runner) for the deadline of its
    /// lease: past it, flotilla fails the lease and frees its slot even if no cleanup ever
    /// comes.
    #[arg(long, default_value = "1h", value_parser = humantime::parse_duration)]
    deadline_grace: Duration,
    /// Take the job's identity from CUSTOM_ENV_CI_JOB_ID and CUSTOM_ENV_CI_PROJECT_ID when the
    /// runner writes no JOB_RESPONSE_FILE (runners before 14.1). UNSAFE: a job can set those
    /// variables and name another job's lease and containers; only for runners whose every
    /// job is trusted.
    #[arg(long)]
    unsafe_job_identity_from_variables: bool,
    /// The stage GitLab Runner is at.
    #[command(subcommand)]
    stage: Stage,
}

/// `--mode`: where jobs run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum ModeFlag {
    /// Each job in a container on the instance.
    Docker,
    /// Each job directly on the machine over SSH.
    Instance,
}

/// The Custom executor's stages, plus `snippet`.
#[derive(Debug, Subcommand)]
enum Stage {
    /// `config_exec`: prints the JSON the runner reads (builds and cache dirs, driver).
    Config,
    /// `prepare_exec`: leases an instance and starts the job's containers there.
    Prepare,
    /// `run_exec`: runs one stage's script in the job container.
    Run {
        /// The script the runner wrote.
        script: PathBuf,
        /// The stage's name (`prepare_script`, `build_script`, ...).
        stage: String,
    },
    /// `cleanup_exec`: removes the job's containers and gives the instance back.
    Cleanup,
    /// Prints the `[[runners]]` block for GitLab Runner's config.toml.
    Snippet,
    /// For operators: an interactive shell in a running job's container (Docker mode) or in
    /// its directory on its machine (`--mode instance`), through its lease, with the API
    /// token. The host logs who opened it, for which job,
    /// and when it ended; it ends when the job's lease does.
    Terminal {
        /// The GitLab job's id (CI_JOB_ID).
        job: String,
        /// Who opens it, for the host's log [default: $USER].
        #[arg(long)]
        who: Option<String>,
        /// The command to run instead of a login shell (bash where the image has it, else sh).
        #[arg(last = true)]
        command: Vec<String>,
    },
}

/// A stage's exit code for the runner, reported by `main`.
#[derive(Debug, thiserror::Error)]
#[error("exit {0}")]
pub struct ExitWith(pub u8);

fn env_or(flag: &Option<String>, name: &str) -> Option<String> {
    flag.clone()
        .or_else(|| std::env::var(name).ok().filter(|v| !v.is_empty()))
}

/// `2g`, `512m`, `64k`, `1024` (bytes; binary multiples, as Docker reads them).
fn parse_bytes(text: &str) -> Result<i64, String> {
    let t = text.trim().to_ascii_lowercase();
    let t = t.strip_suffix('b').unwrap_or(&t);
    let (digits, shift) = match t.chars().last() {
        Some('k') => (&t[..t.len() - 1], 10),
        Some('m') => (&t[..t.len() - 1], 20),
        Some('g') => (&t[..t.len() - 1], 30),
        _ => (t, 0),
    };
    let n: i64 = digits
        .parse()
        .map_err(|_| format!("{text:?}: expected a size such as 512m or 2g"))?;
    n.checked_mul(1 << shift)
        .filter(|b| *b >= 6 << 20)
        .ok_or_else(|| format!("{text:?}: expected at least 6m (Docker's minimum)"))
}

/// `1.5` CPUs as billionths of a CPU.
fn parse_cpus(text: &str) -> Result<i64, String> {
    let cpus: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?}: expected a number of CPUs such as 1.5"))?;
    if !(cpus.is_finite() && cpus > 0.0 && cpus <= 1024.0) {
        return Err(format!("{text:?}: expected between 0 and 1024 CPUs"));
    }
    Ok((cpus * 1e9).round() as i64)
}

impl Args {
    fn api(&self) -> anyhow::Result<ApiClient> {
        let url =
            env_or(&self.url, "FLOTILLA_URL").unwrap_or_else(|| "http://127.0.0.1:8080".into());
        let pool = env_or(&self.pool, "FLOTILLA_POOL")
            .context("no pool: pass --pool or set FLOTILLA_POOL")?;
        let file = self
            .token_file
            .clone()
            .or_else(|| std::env::var_os("FLOTILLA_TOKEN_FILE").map(PathBuf::from));
        let token = match file {
            Some(path) => {
                flotilla_net::fs::check_secret_file_mode(&path)
                    .map_err(|why| anyhow::anyhow!("--token-file: {why}"))?;
                Some(
                    std::fs::read_to_string(&path)
                        .with_context(|| format!("--token-file {}", path.display()))?
                        .trim()
                        .to_string(),
                )
            }
            None => std::env::var("FLOTILLA_TOKEN")
                .ok()
                .filter(|t| !t.is_empty()),
        };
        Ok(ApiClient::with_transport(
            &url,
            token,
            &pool,
            &self.transport(),
        )?)
    }

    /// `--ca-file` (or `FLOTILLA_CA_FILE`) and `--insecure-http`.
    fn transport(&self) -> flotilla_gitlab::TransportOptions {
        flotilla_gitlab::TransportOptions {
            ca_file: self
                .ca_file
                .clone()
                .or_else(|| std::env::var_os("FLOTILLA_CA_FILE").map(PathBuf::from)),
            insecure_http: self.insecure_http,
        }
    }

    fn settings(&self) -> anyhow::Result<DriverSettings> {
        let state_dir = self
            .state_dir
            .clone()
            .or_else(|| {
                std::env::var_os("FLOTILLA_DRIVER_STATE_DIR")
                    .filter(|v| !v.is_empty())
                    .map(PathBuf::from)
            })
            .or_else(flotilla_gitlab::default_state_dir);
        Ok(DriverSettings {
            acquire_timeout: self.acquire_timeout,
            restart_window: self.restart_window,
            job_identity_from_variables: self.unsafe_job_identity_from_variables,
            state_dir,
            deadline_grace: self.deadline_grace,
            mode: self.mode()?,
        })
    }

    fn docker(&self) -> anyhow::Result<DockerSettings> {
        Ok(DockerSettings {
            builds_dir: self.builds_dir.clone(),
            cache_dir: self.cache_dir.clone(),
            default_image: self.default_image.clone(),
            pull_policy: self.pull_policy,
            limits: JobLimits {
                memory_bytes: self.memory,
                nano_cpus: self.cpus,
                pids: self.pids_limit.map(i64::from),
            },
            cache: CacheBounds {
                max_age: self.cache_max_age,
                max_volumes: self.cache_max_volumes.max(1),
            },
            helper_image: self.helper_image.clone(),
            // Read by `run`, not by `snippet`, which only names the file.
            helper_registry_auth: None,
            options: ContainerOptions {
                privileged: self.privileged,
                volumes: self.volumes.clone(),
                shm_size: self.shm_size,
                devices: self.devices.clone(),
                extra_hosts: self.extra_hosts.clone(),
                dns: self.dns.clone(),
            },
            allowed_images: self.allowed_images.clone(),
            allowed_services: self.allowed_services.clone(),
        })
    }

    /// The helper image's registry credentials (a secret: its file must not be open to
    /// other users).
    fn helper_registry_auth(&self) -> anyhow::Result<Option<String>> {
        let Some(path) = &self.helper_registry_auth else {
            return Ok(None);
        };
        flotilla_net::fs::check_secret_file_mode(path)
            .map_err(|why| anyhow::anyhow!("--helper-registry-auth: {why}"))?;
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("--helper-registry-auth {}", path.display()))?;
        serde_json::from_str::<serde_json::Value>(&text).with_context(|| {
            format!(
                "--helper-registry-auth {}: not a Docker config.json",
                path.display()
            )
        })?;
        Ok(Some(text))
    }

    fn mode(&self) -> anyhow::Result<Mode> {
        match self.mode {
            ModeFlag::Docker => Ok(Mode::Docker(Box::new(self.docker()?))),
            ModeFlag::Instance => {
                let mut settings =
                    InstanceSettings::new(self.os, self.shell, self.machine_dir.clone())?;
                settings.shared_across_projects = self.unsafe_share_machines_across_projects;
                Ok(Mode::Instance(settings))
            }
        }
    }

    /// Runs the stage; a job or system failure becomes the runner's exit code.
    pub async fn run(self) -> anyhow::Result<()> {
        if let Stage::Snippet = self.stage {
            print!("{}", self.snippet(&self.limit_lines().await)?);
            return Ok(());
        }
        if let Stage::Terminal { job, who, command } = &self.stage {
            let on_machine = match self.mode {
                ModeFlag::Instance => Some(
                    InstanceSettings::new(self.os, self.shell, self.machine_dir.clone())?
                        .terminal_command(job, command),
                ),
                ModeFlag::Docker => None,
            };
            return terminal(&self.api()?, job, who.as_deref(), command, on_machine).await;
        }
        let mut settings = self.settings()?;
        if let Mode::Docker(own) = &mut settings.mode {
            own.helper_registry_auth = self.helper_registry_auth()?;
        }
        let api = self.api()?;
        let env: BTreeMap<String, String> = std::env::vars().collect();
        if let (Stage::Config, Mode::Docker(_)) = (&self.stage, &settings.mode) {
            return super::print_json(&flotilla_gitlab::config(&settings, api.pool(), None));
        }
        let job = match Job::from_env(&env, settings.job_identity_from_variables) {
            Ok(job) => job,
            Err(e) => {
                eprintln!("flotilla: {e}");
                let code = Outcome::SystemFailure(e.to_string()).exit_code(None);
                return Err(ExitWith(code as u8).into());
            }
        };
        if let Stage::Config = self.stage {
            return super::print_json(&flotilla_gitlab::config(&settings, api.pool(), Some(&job)));
        }
        let outcome = match &self.stage {
            Stage::Prepare => flotilla_gitlab::prepare(&api, &job, &settings).await,
            Stage::Run { script, stage } => {
                let mut stop = crate::signals::Stop::new()?;
                let cancel = async move {
                    stop.recv().await;
                };
                flotilla_gitlab::run(&api, &job, &settings, script, stage, cancel).await
            }
            Stage::Cleanup => flotilla_gitlab::cleanup(&api, &job, &settings).await,
            Stage::Config | Stage::Snippet | Stage::Terminal { .. } => Outcome::Success,
        };
        if let Outcome::SystemFailure(why) = &outcome {
            eprintln!("flotilla: {why}");
        }
        match outcome.exit_code(Some(&job)) {
            0 => Ok(()),
            code => Err(ExitWith(u8::try_from(code).unwrap_or(1)).into()),
        }
    }
}
