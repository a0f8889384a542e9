//! What a migration leaves behind: the config file (never over an existing one), the runner
//! blocks with their tokens beside it (0600), and the report a person reads.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context as _;

use super::{Item, Migration};

/// Writes the configuration to `out` (created, never replaced) and, when any runner was
/// migrated, the runner blocks with their tokens to `NAME.runners.toml` beside it.
pub fn write(m: &Migration, out: &Path) -> anyhow::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(out)
        .with_context(|| {
            format!(
                "{}: cannot create (an existing file is never replaced)",
                out.display()
            )
        })?;
    f.write_all(m.config.as_bytes())
        .with_context(|| format!("{}: cannot write", out.display()))?;
    if !m.runners_toml_with_tokens.is_empty() {
        write_private_new(&runners_file(out), m.runners_toml_with_tokens.as_bytes())?;
    }
    Ok(())
}

/// Where the runner blocks with their tokens go: beside the config, `NAME.runners.toml`.
fn runners_file(config: &Path) -> PathBuf {
    let stem = config
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "flotilla".into());
    config.with_file_name(format!("{stem}.runners.toml"))
}

/// Creates `path` (never over an existing file) readable by its owner only, with `bytes`.
fn write_private_new(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut f = options.open(path).with_context(|| {
        format!(
            "{}: cannot create (an existing file is never replaced)",
            path.display()
        )
    })?;
    f.write_all(bytes)
        .with_context(|| format!("{}: cannot write", path.display()))
}

/// The report as text.
pub fn report(m: &Migration, output: Option<&Path>) -> String {
    let mut s = String::new();
    let list = |s: &mut String, title: &str, items: &[Item]| {
        if items.is_empty() {
            return;
        }
        s.push_str(&format!("  {title}:\n"));
        for i in items {
            let line = i.line.map(|l| format!(" (line {l})")).unwrap_or_default();
            s.push_str(&format!("    {}{line}: {}\n", i.key, i.reason));
        }
    };
    for r in &m.runners {
        match &r.pool {
            Some(pool) => s.push_str(&format!("runner {:?} → pool {pool:?}\n", r.runner)),
            None => s.push_str(&format!("runner {:?}: NOT migrated\n", r.runner)),
        }
        list(&mut s, "refused", &r.refused);
        list(&mut s, "changed meaning (check)", &r.changed);
        list(&mut s, "not carried over", &r.unmapped);
        // A refused runner gets no pool, so nothing to create for it either.
        if let (Some(g), Some(_)) = (&r.group, &r.pool) {
            s.push_str(&format!("  create the {} group once:\n", g.cloud));
            for c in &g.commands {
                s.push_str(&format!("    {c}\n"));
            }
            s.push_str("  the plugin's permissions:\n");
            for l in g.permissions.lines() {
                s.push_str(&format!("    {l}\n"));
            }
        }
    }
    for o in &m.other_runners {
        s.push_str(&format!("runner {o:?}: not docker+machine, left alone\n"));
    }
    if !m.runners_toml.is_empty() {
        s.push_str("\nIn GitLab Runner's config.toml, replace each migrated runner's [[runners]] block with:\n\n");
        s.push_str(&m.runners_toml);
        match output {
            Some(out) => s.push_str(&format!(
                "(the same blocks with the runners' tokens are in {}, readable by you only)\n",
                runners_file(out).display()
            )),
            None => s.push_str("(write the configuration with -o FILE to also get these blocks with the runners' tokens)\n"),
        }
    }
    s
}
