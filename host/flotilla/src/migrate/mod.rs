//! `flotilla migrate docker-machine`: GitLab Runner `docker+machine` runners as Flotilla pools.
//!
//! Reads a GitLab Runner `config.toml` and, for each `[[runners]]` with
//! `executor = "docker+machine"`, maps `[runners.machine]` to a pool and its policies, turns the
//! Docker Machine driver's `MachineOptions` into the cloud group the pool's plugin manages
//! (printed as the cloud's own CLI commands, with the permissions the plugin needs), and lists
//! every key it could not carry over with the reason. Nothing is dropped silently.
//!
//! Docker Machine's periods are gorhill/cronexpr expressions, checked by GitLab Runner's
//! `helpers/timeperiod` as "the next matching second is within one second of now": a period is
//! active during the *seconds* it matches. Only 7-field periods whose seconds field matches
//! every second and whose year field is `*` are whole minutes, which 5-field cron expresses
//! exactly; anything else is refused with the period named.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use flotilla_validate::{KeyPath, Seg};
use serde::Serialize;

use crate::config::locate::Locator;

mod aws;
mod azure;
mod gcp;
mod policy;
mod pool;
pub mod report;

pub use policy::convert_period;

/// What the command was asked for besides the file.
#[derive(Debug, Clone)]
pub struct Options {
    /// The plugin reference for each cloud (`aws`), written as each pool's `plugin`.
    pub plugins: BTreeMap<String, String>,
    /// The zone written where a section's `Timezone` is empty (GitLab Runner's local zone).
    pub timezone: String,
    /// `max_instances` where a runner's `limit` is 0 (unlimited) and `concurrent` is unset.
    pub max_instances: Option<u32>,
    /// The API token file, written as `server.token` and the driver's `--token-file`.
    pub token_file: String,
    /// The lease API's address: `server.listen`, and the driver's `--url`.
    pub listen: std::net::SocketAddr,
    /// What the runner runs for each stage.
    pub exe: crate::custom_executor::DriverCommand,
}

/// The whole result: the Flotilla configuration and the report.
#[derive(Debug, Serialize)]
pub struct Migration {
    /// The configuration text (`flotilla.toml`); pools only for the runners that migrated.
    pub config: String,
    /// One entry per `docker+machine` runner.
    pub runners: Vec<RunnerReport>,
    /// Runners with another executor, left alone.
    pub other_runners: Vec<String>,
    /// The `[[runners]]` blocks that replace the migrated runners in GitLab Runner's
    /// `config.toml` (Custom executor through `flotilla gitlab`), with each runner's token
    /// replaced by a placeholder: this text is printed.
    pub runners_toml: String,
    /// The same blocks with the tokens, for a file only the operator can read.
    #[serde(skip)]
    pub runners_toml_with_tokens: String,
}

/// What became of one runner.
#[derive(Debug, Serialize)]
pub struct RunnerReport {
    /// The runner's `name`.
    pub runner: String,
    /// The pool written for it; `None` when it was refused.
    pub pool: Option<String>,
    /// Why it was refused (every reason at once).
    pub refused: Vec<Item>,
    /// Keys carried over with a change of meaning the operator should check.
    pub changed: Vec<Item>,
    /// Keys that could not be carried over.
    pub unmapped: Vec<Item>,
    /// The cloud group the pool's plugin manages, to create once.
    pub group: Option<GroupSpec>,
}

/// A key and what happened to it.
#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct Item {
    /// Where, e.g. `runners[0].machine.MachineName` or `MachineOptions: amazonec2-tags`.
    pub key: String,
    /// Its line in the runner config, when known.
    pub line: Option<usize>,
    /// Why.
    pub reason: String,
}

/// The cloud group to create once, in the cloud's own terms.
#[derive(Debug, Serialize)]
pub struct GroupSpec {
    /// `aws`, `gcp` or `azure`.
    pub cloud: String,
    /// Commands that create it.
    pub commands: Vec<String>,
    /// The permissions the plugin needs, as the cloud's policy document.
    pub permissions: String,
}

/// A runner-config problem that stops the whole migration (the file cannot be read as TOML).
#[derive(Debug, thiserror::Error)]
#[error("{file}: {message}")]
pub struct MigrateError {
    /// The file.
    pub file: String,
    /// What is wrong, with the line when known.
    pub message: String,
}

/// Migrates the runner config `text` read from `file`.
pub fn migrate(file: &str, text: &str, options: &Options) -> Result<Migration, MigrateError> {
    let doc: toml::Table = toml::from_str(text).map_err(|e| MigrateError {
        file: file.to_string(),
        message: e.to_string().trim().to_string(),
    })?;
    let locator = Locator::new(text);
    let concurrent = doc
        .get("concurrent")
        .and_then(toml::Value::as_integer)
        .and_then(|c| u32::try_from(c).ok())
        .filter(|c| *c > 0);
    let empty = Vec::new();
    let runners = doc
        .get("runners")
        .and_then(toml::Value::as_array)
        .unwrap_or(&empty);
    let mut out = Migration {
        config: String::new(),
        runners: Vec::new(),
        other_runners: Vec::new(),
        runners_toml: String::new(),
        runners_toml_with_tokens: String::new(),
    };
    let mut pools = String::new();
    let mut names = Vec::<String>::new();
    for (i, runner) in runners.iter().enumerate() {
        let at = KeyPath::root().key("runners").index(i);
        let name = runner
            .get("name")
            .and_then(toml::Value::as_str)
            .map_or_else(|| format!("runners[{i}]"), str::to_string);
        if runner.get("executor").and_then(toml::Value::as_str) != Some("docker+machine") {
            out.other_runners.push(name);
            continue;
        }
        let mut r = Runner {
            at: &at,
            locator: &locator,
            report: RunnerReport {
                runner: name.clone(),
                pool: None,
                refused: Vec::new(),
                changed: Vec::new(),
                unmapped: Vec::new(),
                group: None,
            },
        };
        let pool_name = unique(pool_name(&name), &names);
        if let Some(text) = r.pool(runner, &pool_name, concurrent, options) {
            match runner_block(runner, &pool_name, options) {
                Ok((shown, real)) => {
                    out.runners_toml.push_str(&shown);
                    out.runners_toml_with_tokens.push_str(&real);
                }
                Err(e) => r.refuse(&at, format!("cannot write its [[runners]] block: {e}")),
            }
            names.push(pool_name.clone());
            r.report.pool = Some(pool_name);
            pools.push_str(&text);
        }
        out.runners.push(r.report);
    }
    out.config = header(file, &out, options) + &pools;
    Ok(out)
}

/// The runner's new `[[runners]]` block: its own keys (name, url, token, limit, cache, ...),
/// the Custom executor through `flotilla gitlab` on the migrated pool, and `[runners.docker]`
/// `image` as the driver's default image. Returns it with the token replaced by a placeholder,
/// and with the token.
fn runner_block(
    runner: &toml::Value,
    pool: &str,
    options: &Options,
) -> anyhow::Result<(String, String)> {
    let mut table = runner.as_table().cloned().unwrap_or_default();
    let image = table
        .get("docker")
        .and_then(|d| d.get("image"))
        .and_then(toml::Value::as_str)
        .map(str::to_string);
    for key in [
        "executor",
        "machine",
        "docker",
        "builds_dir",
        "cache_dir",
        "custom",
    ] {
        table.remove(key);
    }
    table.insert("executor".into(), "custom".into());
    table.insert("builds_dir".into(), "/builds".into());
    table.insert("cache_dir".into(), "/cache".into());
    let mut args: Vec<String> = [
        "--url",
        &format!("http://{}", options.listen),
        "--pool",
        pool,
        "--token-file",
        &options.token_file,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if let Some(image) = image {
        args.extend(["--default-image".to_string(), image]);
    }
    let custom = crate::custom_executor::custom_section(
        &options.exe,
        &args,
        std::time::Duration::from_secs(600),
    )?;
    let render = |table: &toml::Table| -> anyhow::Result<String> {
        let mut doc = toml::Table::new();
        doc.insert(
            "runners".into(),
            toml::Value::Array(vec![toml::Value::Table(table.clone())]),
        );
        Ok(format!("{}{custom}\n", toml::to_string(&doc)?))
    };
    let real = render(&table)?;
    let name = table
        .get("name")
        .and_then(toml::Value::as_str)
        .unwrap_or(pool)
        .to_string();
    redact(&mut table, &name, "runners");
    Ok((render(&table)?, real))
}

/// The runner keys whose text the printed blocks show as it is: names, addresses, paths,
/// images and switches, never a credential. Every other string (a token, `AccountKey`,
/// `PrivateKey`, a script, a key this list does not know) is replaced with a placeholder
/// naming where the real one is, so a secret under a new or unexpected name stays out of the
/// printed text. Matched case-insensitively, as the runner's TOML decoding does.
const SHOWN: &[&str] = &[
    "name",
    "url",
    "clone_url",
    "executor",
    "shell",
    "builds_dir",
    "cache_dir",
    "config_exec",
    "prepare_exec",
    "run_exec",
    "cleanup_exec",
    "image",
    "pull_policy",
    "network_mode",
    "helper_image",
    "memory",
    "cpus",
    "shm_size",
    "type",
    "path",
    "serveraddress",
    "bucketname",
    "bucketlocation",
    "authenticationtype",
    "accountname",
    "containername",
    "storagedomain",
    "credentialsfile",
    "volumes",
    "allowed_images",
    "allowed_services",
    "allowed_pull_policies",
    "config_args",
    "prepare_args",
    "run_args",
    "cleanup_args",
];

/// Replaces every string of a runner block that [`SHOWN`] does not list with a placeholder
/// naming where the real one is, for the text that is printed. `environment` entries keep
/// their names (`KEY=<...>`), and a URL loses any user information.
fn redact(table: &mut toml::Table, runner: &str, at: &str) {
    for (key, value) in table.iter_mut() {
        let here = format!("{at}.{key}");
        let placeholder = || format!("<{here} of runner {runner} in the original config.toml>");
        let shown = SHOWN.iter().any(|k| k.eq_ignore_ascii_case(key));
        match value {
            toml::Value::Table(inner) => redact(inner, runner, &here),
            toml::Value::Array(items) => {
                for item in items.iter_mut() {
                    match item {
                        toml::Value::Table(inner) => redact(inner, runner, &here),
                        toml::Value::String(text) if key.eq_ignore_ascii_case("environment") => {
                            let name = text.split_once('=').map_or("", |(n, _)| n);
                            *text = format!("{name}=<{here} of runner {runner}>");
                        }
                        toml::Value::String(text) if !shown || has_user_info(text) => {
                            *text = placeholder();
                        }
                        _ => {}
                    }
                }
            }
            toml::Value::String(text) if !shown || has_user_info(text) => *text = placeholder(),
            _ => {}
        }
    }
}

/// Whether `text` is a URL carrying user information (`scheme://user:pass@host`).
fn has_user_info(text: &str) -> bool {
    text.split_once("://").is_some_and(|(_, rest)| {
        rest.split(['/', '?', '#'])
            .next()
            .is_some_and(|authority| authority.contains('@'))
    })
}

/// One command line for a POSIX shell: each argument as it is when it holds only characters
/// no shell treats specially, else single-quoted (an inner `'` written as `'\''`). The
/// printed "create the group once" commands are built from arguments this way, so a value
/// from the runner's config (a region, a subnet, an image) is always one argument, never
/// shell text.
pub(crate) fn shell_line<S: AsRef<str>>(argv: &[S]) -> String {
    argv.iter()
        .map(|a| {
            let a = a.as_ref();
            let plain = !a.is_empty()
                && a.bytes().all(|b| {
                    b.is_ascii_alphanumeric()
                        || matches!(
                            b,
                            b'-' | b'_' | b'.' | b'/' | b':' | b',' | b'=' | b'@' | b'%' | b'+'
                        )
                });
            if plain {
                a.to_string()
            } else {
                format!("'{}'", a.replace('\'', "'\\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Owned arguments, to extend with more.
pub(crate) fn argv(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// A TOML array of strings, written by the serializer.
pub(crate) fn toml_strings<S: AsRef<str>>(items: &[S]) -> String {
    toml::Value::Array(
        items
            .iter()
            .map(|s| toml::Value::String(s.as_ref().to_string()))
            .collect(),
    )
    .to_string()
}

/// The top of the written file: where it came from, and the API server the runner blocks
/// call.
fn header(file: &str, m: &Migration, options: &Options) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# Written by `flotilla migrate docker-machine` from {file}."
    );
    let _ = writeln!(
        s,
        "# Read the report it printed: keys that changed meaning or could not be carried over."
    );
    if m.runners.iter().all(|r| r.pool.is_none()) {
        let _ = writeln!(s, "# No runner could be migrated.");
    }
    let _ = write!(
        s,
        "\n[server]\n# The [[runners]] blocks this migration printed call this address with this token.\n# Create the token once: head -c 32 /dev/urandom | base64 > {token} && chmod 600 {token}\nlisten = {}\ntoken = {{ file = {} }}\n",
        quote(&options.listen.to_string()),
        quote(&options.token_file),
        token = options.token_file,
    );
    s
}

/// `[a-z0-9-]` of the runner's name, at most 48 characters, never empty.
fn pool_name(runner: &str) -> String {
    let mut s: String = runner
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    while s.contains("--") {
        s = s.replace("--", "-");
    }
    let s: String = s.trim_matches('-').chars().take(48).collect();
    if s.is_empty() {
        "runner".to_string()
    } else {
        s
    }
}

fn unique(base: String, taken: &[String]) -> String {
    let mut name = base.clone();
    let mut n = 2;
    while taken.contains(&name) {
        name = format!("{base}-{n}");
        n += 1;
    }
    name
}

struct Runner<'a> {
    at: &'a KeyPath,
    locator: &'a Locator,
    report: RunnerReport,
}

/// The `[runners.machine]` keys this migration maps; every other key is reported.
const MAPPED_MACHINE_KEYS: [&str; 9] = [
    "IdleCount",
    "IdleCountMin",
    "IdleScaleFactor",
    "IdleTime",
    "MaxBuilds",
    "MaxGrowthRate",
    "MachineDriver",
    "MachineOptions",
    "autoscaling",
];

/// What one cloud's walk over a runner's machine options made: the group to create (its
/// commands, and the permissions its plugin needs), and the pool's sandbox and plugin settings.
struct CloudPool {
    group: GroupSpec,
    sandbox: String,
    settings: String,
}

/// A driver's `MachineOptions`: each option by name, every value with where it was written.
type DriverOptions = BTreeMap<String, Vec<(String, KeyPath)>>;

/// The last value of the driver option `PREFIX-name`.
fn option(opts: &DriverOptions, prefix: &str, name: &str) -> Option<String> {
    opts.get(&format!("{prefix}{name}"))
        .and_then(|v| v.last())
        .map(|(v, _)| v.clone())
}

fn with_option(at: &KeyPath, option: &str) -> KeyPath {
    let mut segs = at.segments().to_vec();
    segs.push(Seg::Key(format!("({option})")));
    KeyPath::from(segs)
}

fn display(path: &KeyPath) -> String {
    let mut s = String::new();
    for seg in path.segments() {
        match seg {
            Seg::Key(k) if k.starts_with('(') => s.push_str(&format!(" {k}")),
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

fn quote(s: &str) -> String {
    toml::Value::String(s.to_string()).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seven_field_periods_convert_exactly_and_others_are_refused() {
        assert_eq!(
            convert_period("* * 9-17 * * mon-fri *").as_deref(),
            Ok("* 9-17 * * mon-fri")
        );
        assert_eq!(
            convert_period("0-59 */5 * * * * ?").as_deref(),
            Ok("*/5 * * * *")
        );
        for bad in [
            "0 * 9-17 * * mon-fri *",
            "* * * * * * 2027",
            "* 9-17 * * mon-fri",
            "@daily",
            "* * 25 * * * *",
        ] {
            let e = convert_period(bad).expect_err(bad);
            assert!(e.contains(bad), "{e}");
        }
    }

    #[test]
    fn pool_names_are_unique_and_tame() {
        assert_eq!(pool_name("Docker  Machine #1"), "docker-machine-1");
        assert_eq!(pool_name("$$$"), "runner");
        assert_eq!(unique("a".into(), &["a".into(), "a-2".into()]), "a-3");
    }
}
