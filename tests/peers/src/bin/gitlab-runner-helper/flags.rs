//! Command-line flags the way the runner's helper reads them: urfave/cli v1 over Go's `flag`
//! package, with the flag list generated from each command's struct tags (`long:"…"`,
//! `env:"…"`) by `common.NewCommand`. So `-name` and `--name` are the same flag, values come
//! as `--name value` or `--name=value`, a switch is `--name` or `--name=false`, repeated
//! flags append (string slices), and a flag not given takes its `env:` variable. A flag that
//! is not declared is an error (`flag provided but not defined: -x`), which makes the helper
//! exit 1 (`apps/gitlab-runner-helper/main.go`: `logrus.Fatal(err)`).
//!
//! Owns: parsing and typed lookup. Must not know: what any flag means.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::ctx::Env;

/// What a flag holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `bool`: given alone means true.
    Switch,
    /// `string`.
    Text,
    /// `[]string`: each use appends.
    Texts,
    /// `int` / `int64`.
    Integer,
    /// `time.Duration`, in Go's syntax (`1h0m0s`, `10m`, `1.5s`).
    Duration,
}

/// One declared flag.
#[derive(Debug, Clone, Copy)]
pub struct Flag {
    pub name: &'static str,
    pub kind: Kind,
    pub env: Option<&'static str>,
}

/// A flag without an environment variable.
pub const fn flag(name: &'static str, kind: Kind) -> Flag {
    Flag {
        name,
        kind,
        env: None,
    }
}

/// A flag that falls back to `env`.
pub const fn env_flag(name: &'static str, kind: Kind, env: &'static str) -> Flag {
    Flag {
        name,
        kind,
        env: Some(env),
    }
}

#[derive(Debug, Clone)]
enum Value {
    Switch(bool),
    Text(String),
    Texts(Vec<String>),
    Integer(i64),
    Duration(Duration),
}

/// The parsed flags; lookups of an absent flag give Go's zero value.
#[derive(Debug, Default)]
pub struct Parsed {
    values: BTreeMap<&'static str, Value>,
    /// `--help` / `-h` was given.
    pub help: bool,
}

impl Parsed {
    pub fn text(&self, name: &str) -> String {
        match self.values.get(name) {
            Some(Value::Text(text)) => text.clone(),
            _ => String::new(),
        }
    }

    pub fn texts(&self, name: &str) -> Vec<String> {
        match self.values.get(name) {
            Some(Value::Texts(texts)) => texts.clone(),
            _ => Vec::new(),
        }
    }

    pub fn switch(&self, name: &str) -> Option<bool> {
        match self.values.get(name) {
            Some(Value::Switch(on)) => Some(*on),
            _ => None,
        }
    }

    pub fn integer(&self, name: &str) -> Option<i64> {
        match self.values.get(name) {
            Some(Value::Integer(n)) => Some(*n),
            _ => None,
        }
    }

    pub fn duration(&self, name: &str) -> Option<Duration> {
        match self.values.get(name) {
            Some(Value::Duration(d)) => Some(*d),
            _ => None,
        }
    }
}

/// Parses `args` (everything after the command name) against `flags`. Positional arguments
/// are ignored, as the helper's commands take none (urfave/cli v1 reorders them after the
/// flags, so they may appear anywhere).
pub fn parse(flags: &[Flag], args: &[String], env: &Env) -> Result<Parsed, String> {
    let mut parsed = Parsed::default();
    let mut given: Vec<&'static str> = Vec::new();
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        if arg == "--" {
            break;
        }
        let Some(body) = arg.strip_prefix("--").or_else(|| arg.strip_prefix('-')) else {
            continue;
        };
        if body.is_empty() || body.starts_with('-') || body.starts_with('=') {
            if body.is_empty() {
                continue;
            }
            return Err(format!("bad flag syntax: {arg}"));
        }
        let (name, inline) = match body.split_once('=') {
            Some((name, value)) => (name, Some(value.to_string())),
            None => (body, None),
        };
        if name == "help" || name == "h" {
            parsed.help = true;
            continue;
        }
        let Some(spec) = flags.iter().find(|f| f.name == name) else {
            return Err(format!("flag provided but not defined: -{name}"));
        };
        let raw = match (spec.kind, inline) {
            (Kind::Switch, None) => "true".to_string(),
            (_, Some(value)) => value,
            (_, None) => rest
                .next()
                .cloned()
                .ok_or_else(|| format!("flag needs an argument: -{name}"))?,
        };
        let value = typed(spec, &raw)
            .map_err(|why| format!("invalid value {raw:?} for flag -{name}: {why}"))?;
        store(&mut parsed, spec, value);
        given.push(spec.name);
    }
    apply_env(&mut parsed, flags, &given, env)?;
    Ok(parsed)
}

fn store(parsed: &mut Parsed, spec: &Flag, value: Value) {
    match (parsed.values.get_mut(spec.name), value) {
        (Some(Value::Texts(list)), Value::Texts(more)) => list.extend(more),
        (_, value) => {
            parsed.values.insert(spec.name, value);
        }
    }
}

/// urfave/cli v1 applies `EnvVar` as the default before the command line is parsed; a
/// slice variable is split on commas.
fn apply_env(
    parsed: &mut Parsed,
    flags: &[Flag],
    given: &[&'static str],
    env: &Env,
) -> Result<(), String> {
    for spec in flags {
        let (Some(var), false) = (spec.env, given.contains(&spec.name)) else {
            continue;
        };
        let Some(raw) = env.get(var) else {
            continue;
        };
        if raw.is_empty() && spec.kind != Kind::Text {
            continue;
        }
        let value = match spec.kind {
            Kind::Texts => Value::Texts(raw.split(',').map(str::to_string).collect()),
            _ => typed(spec, raw).map_err(|why| {
                format!(
                    "could not parse {raw:?} as value for flag {}: {why}",
                    spec.name
                )
            })?,
        };
        parsed.values.insert(spec.name, value);
    }
    Ok(())
}

fn typed(spec: &Flag, raw: &str) -> Result<Value, String> {
    Ok(match spec.kind {
        Kind::Switch => Value::Switch(parse_bool(raw)?),
        Kind::Text => Value::Text(raw.to_string()),
        Kind::Texts => Value::Texts(vec![raw.to_string()]),
        Kind::Integer => Value::Integer(raw.parse::<i64>().map_err(|_| "parse error")?),
        Kind::Duration => Value::Duration(parse_duration(raw)?),
    })
}

/// `strconv.ParseBool`.
pub fn parse_bool(raw: &str) -> Result<bool, String> {
    match raw {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        _ => Err("parse error".into()),
    }
}

/// `time.ParseDuration`, for non-negative values (a negative timeout has no meaning here).
pub fn parse_duration(raw: &str) -> Result<Duration, String> {
    let text = raw.strip_prefix('+').unwrap_or(raw);
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    if text.is_empty() || text.starts_with('-') {
        return Err(format!("time: invalid duration {raw:?}"));
    }
    let mut total = 0f64;
    let mut rest = text;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| format!("time: missing unit in duration {raw:?}"))?;
        let (number, after) = rest.split_at(number_len);
        let value: f64 = number
            .parse()
            .map_err(|_| format!("time: invalid duration {raw:?}"))?;
        let unit_len = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, next) = after.split_at(unit_len);
        let seconds = match unit {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(format!("time: unknown unit {unit:?} in duration {raw:?}")),
        };
        total += value * seconds;
        rest = next;
    }
    Ok(Duration::from_secs_f64(total))
}

/// Go's `time.Duration.String` for the durations the helper logs (`100ms`, `1.5s`, `1m0s`).
pub fn go_duration(d: Duration) -> String {
    let nanos = d.as_nanos();
    if nanos == 0 {
        return "0s".into();
    }
    if nanos < 1_000 {
        return format!("{nanos}ns");
    }
    if nanos < 1_000_000 {
        return format!("{}µs", trim_fraction(nanos as f64 / 1e3));
    }
    if nanos < 1_000_000_000 {
        return format!("{}ms", trim_fraction(nanos as f64 / 1e6));
    }
    let whole = d.as_secs();
    let (hours, minutes) = (whole / 3600, (whole % 3600) / 60);
    let seconds = (whole % 60) as f64 + f64::from(d.subsec_nanos()) / 1e9;
    let seconds = format!("{}s", trim_fraction(seconds));
    match (hours, minutes) {
        (0, 0) => seconds,
        (0, m) => format!("{m}m{seconds}"),
        (h, m) => format!("{h}h{m}m{seconds}"),
    }
}

fn trim_fraction(value: f64) -> String {
    let text = format!("{value:.9}");
    let text = text.trim_end_matches('0');
    text.trim_end_matches('.').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    const FLAGS: &[Flag] = &[
        flag("file", Kind::Text),
        flag("path", Kind::Texts),
        flag("untracked", Kind::Switch),
        flag("timeout", Kind::Integer),
        env_flag("token", Kind::Text, "CI_JOB_TOKEN"),
        flag("wait", Kind::Duration),
    ];

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_string()).collect()
    }

    #[test]
    fn single_and_double_dashes_and_inline_values_are_the_same_flag() {
        let parsed = parse(
            FLAGS,
            &args(&["-file", "a", "--path=x", "--path", "y", "--untracked"]),
            &Env::default(),
        )
        .expect("valid flags");
        assert_eq!(parsed.text("file"), "a");
        assert_eq!(parsed.texts("path"), vec!["x", "y"]);
        assert_eq!(parsed.switch("untracked"), Some(true));
    }

    #[test]
    fn an_unknown_flag_is_refused_with_gos_message() {
        let err = parse(FLAGS, &args(&["--nope"]), &Env::default()).expect_err("unknown");
        assert_eq!(err, "flag provided but not defined: -nope");
    }

    #[test]
    fn a_flag_not_given_takes_its_environment_variable() {
        let env = Env::from_pairs(&[("CI_JOB_TOKEN", "secret")]);
        let parsed = parse(FLAGS, &[], &env).expect("valid");
        assert_eq!(parsed.text("token"), "secret");
        let parsed = parse(FLAGS, &args(&["--token", "given"]), &env).expect("valid");
        assert_eq!(parsed.text("token"), "given");
    }

    #[test]
    fn go_durations_parse_and_print_back() {
        let cases = [
            ("1h0m0s", 3600.0),
            ("10m0s", 600.0),
            ("1.5s", 1.5),
            ("300ms", 0.3),
        ];
        for (text, seconds) in cases {
            let d = parse_duration(text).expect("valid duration");
            assert!((d.as_secs_f64() - seconds).abs() < 1e-9, "{text}");
        }
        assert_eq!(go_duration(Duration::from_secs(3600)), "1h0m0s");
        assert_eq!(go_duration(Duration::from_millis(100)), "100ms");
        assert_eq!(go_duration(Duration::from_millis(1500)), "1.5s");
        assert!(parse_duration("5").is_err());
    }

    #[test]
    fn a_non_numeric_integer_is_refused() {
        let err = parse(FLAGS, &args(&["--timeout", "x"]), &Env::default()).expect_err("bad");
        assert!(
            err.contains("invalid value \"x\" for flag -timeout"),
            "{err}"
        );
    }
}
