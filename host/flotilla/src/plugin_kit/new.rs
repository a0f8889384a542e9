//! `flotilla plugin new NAME --lang rust|python|js`: writes a plugin template into `./NAME`
//! with the names filled in. The templates (and the WIT they build against) are embedded in
//! the binary, so this works offline and outside the repository.

use std::path::Path;

/// A template language.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Lang {
    /// Rust with wit-bindgen (wasi:http through its generated bindings).
    Rust,
    /// Python with componentize-py.
    Python,
    /// JavaScript with componentize-js.
    Js,
}

/// The WIT package every template builds against, as `wit/...` files.
const WIT: [(&str, &str); 8] = [
    (
        "wit/provider.wit",
        include_str!("../../../../wit/provider.wit"),
    ),
    (
        "wit/deps/cli.wit",
        include_str!("../../../../wit/deps/cli.wit"),
    ),
    (
        "wit/deps/clocks.wit",
        include_str!("../../../../wit/deps/clocks.wit"),
    ),
    (
        "wit/deps/filesystem.wit",
        include_str!("../../../../wit/deps/filesystem.wit"),
    ),
    (
        "wit/deps/http.wit",
        include_str!("../../../../wit/deps/http.wit"),
    ),
    (
        "wit/deps/io.wit",
        include_str!("../../../../wit/deps/io.wit"),
    ),
    (
        "wit/deps/random.wit",
        include_str!("../../../../wit/deps/random.wit"),
    ),
    (
        "wit/deps/sockets.wit",
        include_str!("../../../../wit/deps/sockets.wit"),
    ),
];

const RUST: [(&str, &str); 3] = [
    (
        "Cargo.toml",
        include_str!("../../../../plugin-template/rust/Cargo.toml"),
    ),
    (
        "README.md",
        include_str!("../../../../plugin-template/rust/README.md"),
    ),
    (
        "src/lib.rs",
        include_str!("../../../../plugin-template/rust/src/lib.rs"),
    ),
];

/// The template's files, its own name in them, and how to build and test it.
fn template(lang: Lang) -> (&'static [(&'static str, &'static str)], &'static str) {
    match lang {
        Lang::Rust => (&RUST, "flotilla-plugin-template"),
        Lang::Python => (&super::templates::PYTHON, super::templates::PYTHON_NAME),
        Lang::Js => (&super::templates::JS, super::templates::JS_NAME),
    }
}

/// A plugin name: lowercase letters, digits and dashes, starting with a letter.
fn valid_name(name: &str) -> bool {
    name.starts_with(|c: char| c.is_ascii_lowercase())
        && !name.ends_with('-')
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

/// The file's text for plugin `name`: the template's own name replaced, and in Cargo.toml
/// the section that only this repository's build reads removed.
fn fill(path: &str, text: &str, template_name: &str, name: &str) -> String {
    let mut out = text
        .replace(template_name, name)
        .replace(&template_name.replace('-', "_"), &name.replace('-', "_"));
    if path == "Cargo.toml" {
        out = out
            .split("\n\n")
            .filter(|section| !section.starts_with("[package.metadata.flotilla-guest]"))
            .collect::<Vec<_>>()
            .join("\n\n");
    }
    out
}

/// The commands that come next.
fn next_steps(lang: Lang, name: &str) -> String {
    let wasm = name.replace('-', "_");
    let (build, file) = match lang {
        Lang::Rust => (
            "rustup target add wasm32-wasip2 && cargo build --release --target wasm32-wasip2"
                .to_string(),
            format!("target/wasm32-wasip2/release/{wasm}.wasm"),
        ),
        Lang::Python => ("./build.sh".to_string(), "plugin.wasm".to_string()),
        Lang::Js => (
            "npm ci && npm run build".to_string(),
            "plugin.wasm".to_string(),
        ),
    };
    format!(
        "Next:\n  cd {name}\n  {build}\n  flotilla plugin test {file} --example-cloud --provision\n"
    )
}

/// Writes the template for `lang` into `dir/name`; what to run next.
pub fn new(dir: &Path, name: &str, lang: Lang) -> anyhow::Result<String> {
    if !valid_name(name) {
        anyhow::bail!(
            "{name:?} is not a plugin name: lowercase letters, digits and dashes, starting with a letter"
        );
    }
    let root = dir.join(name);
    if root.exists() {
        anyhow::bail!("{} already exists; nothing was written", root.display());
    }
    let (files, template_name) = template(lang);
    // Write into a temporary sibling, then rename: a failure leaves no half template.
    let tmp = dir.join(format!(".{name}.new-{}", std::process::id()));
    let write = || -> std::io::Result<()> {
        for (path, text) in files.iter().chain(WIT.iter()) {
            let target = tmp.join(path);
            if let Some(parent) = target.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::write(&target, fill(path, text, template_name, name))?;
            #[cfg(unix)]
            if path.ends_with(".sh") {
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o755))?;
            }
        }
        std::fs::rename(&tmp, &root)
    };
    if let Err(e) = write() {
        let _ = std::fs::remove_dir_all(&tmp); // best effort; the error below is what matters
        anyhow::bail!("writing {}: {e}", root.display());
    }
    let language = match lang {
        Lang::Rust => "Rust",
        Lang::Python => "Python",
        Lang::Js => "JavaScript",
    };
    Ok(format!(
        "Wrote a {language} plugin template to {}.\n{}",
        root.display(),
        next_steps(lang, name)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_filled_in_and_the_repository_section_is_dropped() {
        let cargo = fill(
            "Cargo.toml",
            RUST[0].1,
            "flotilla-plugin-template",
            "acme-cloud",
        );
        assert!(cargo.contains("name = \"acme-cloud\""), "{cargo}");
        assert!(!cargo.contains("flotilla-guest"), "{cargo}");
        assert!(!cargo.contains("flotilla-plugin-template"), "{cargo}");
    }

    #[test]
    fn bad_names_are_refused() {
        for bad in ["", "Acme", "1acme", "acme-", "ac/me", "a b"] {
            assert!(!valid_name(bad), "{bad:?}");
        }
        assert!(valid_name("acme-cloud2"));
    }
}
