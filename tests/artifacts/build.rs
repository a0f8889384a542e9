//! Builds every guest component (plugins, the template and the test guests) for
//! wasm32-wasip2 in one cargo invocation, then writes their paths as constants plus a
//! `foreach_test_guest!` macro. Host tests call `assert_test_guests_covered!`, so adding a
//! test guest without a host test breaks the build.

use std::env;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

#[path = "../../host/builtin/target_root.rs"]
mod target_root;

/// One guest: a workspace member with `[package.metadata.flotilla-guest]`.
struct Guest {
    package: String,
    constant: String,
    test: bool,
}

/// The guests, read from `cargo metadata`: the one list, kept in each guest's own manifest;
/// and the directories of the workspace crates they depend on by path (the guest-side
/// SDK in `guest/`), whose changes must rebuild them too.
fn guests(cargo: &str, root: &Path) -> (Vec<Guest>, Vec<PathBuf>) {
    let out = Command::new(cargo)
        .current_dir(root)
        .args(["metadata", "--format-version", "1", "--no-deps", "--locked"])
        .output()
        .unwrap_or_else(|e| fail(&format!("cannot run cargo metadata: {e}")));
    if !out.status.success() {
        fail(&format!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| fail(&format!("cargo metadata output: {e}")));
    let mut found: Vec<Guest> = meta
        .get("packages")
        .and_then(|p| p.as_array())
        .into_iter()
        .flatten()
        .filter_map(|p| {
            let guest = p.get("metadata")?.get("flotilla-guest")?;
            Some(Guest {
                package: p.get("name")?.as_str()?.to_string(),
                constant: guest.get("constant")?.as_str()?.to_string(),
                test: guest.get("test").and_then(|t| t.as_bool()).unwrap_or(false),
            })
        })
        .collect();
    found.sort_by(|a, b| a.package.cmp(&b.package));
    if found.is_empty() {
        fail("no workspace member has [package.metadata.flotilla-guest]");
    }
    (found, path_dependencies(&meta))
}

/// The directories of the path dependencies of the guests, and of theirs in turn.
fn path_dependencies(meta: &serde_json::Value) -> Vec<PathBuf> {
    let packages: Vec<&serde_json::Value> = meta
        .get("packages")
        .and_then(|p| p.as_array())
        .into_iter()
        .flatten()
        .collect();
    let dir_of = |p: &serde_json::Value| {
        p.get("manifest_path")
            .and_then(|m| m.as_str())
            .and_then(|m| Path::new(m).parent())
            .map(Path::to_path_buf)
    };
    let mut todo: Vec<&serde_json::Value> = packages
        .iter()
        .copied()
        .filter(|p| {
            p.get("metadata")
                .and_then(|m| m.get("flotilla-guest"))
                .is_some()
        })
        .collect();
    let mut dirs: Vec<PathBuf> = Vec::new();
    while let Some(package) = todo.pop() {
        let deps = package.get("dependencies").and_then(|d| d.as_array());
        // What the guest is built from: its dev-dependencies (host-side test helpers) are not.
        for path in deps
            .into_iter()
            .flatten()
            .filter(|d| d.get("kind").and_then(|k| k.as_str()) != Some("dev"))
            .filter_map(|d| d.get("path").and_then(|p| p.as_str()))
        {
            let path = PathBuf::from(path);
            if dirs.contains(&path) {
                continue;
            }
            if let Some(dep) = packages.iter().find(|p| dir_of(p).as_ref() == Some(&path)) {
                todo.push(dep);
            }
            dirs.push(path);
        }
    }
    dirs
}

fn main() {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap_or_default());
    let root = manifest
        .join("../..")
        .canonicalize()
        .unwrap_or_else(|e| fail(&format!("workspace root: {e}")));
    let out = PathBuf::from(env::var("OUT_DIR").unwrap_or_else(|_| fail("OUT_DIR is not set")));
    // Beside the profiles, in a stable place, so rebuilds are incremental: where
    // scripts/test.sh and host/builtin build them, even when the build names a target (the
    // test run builds for musl; before, a second copy went under `<target>/<triple>/`).
    let target_dir = target_root::of(&out).join("wasm-guests");

    for dir in [
        "wit",
        "plugins",
        "plugin-template/rust",
        "tests/guests",
        "Cargo.toml",
        "Cargo.lock",
    ] {
        println!("cargo:rerun-if-changed={}", root.join(dir).display());
    }

    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let (guests, libraries) = guests(&cargo, &root);
    for dir in libraries {
        println!("cargo:rerun-if-changed={}", dir.display());
    }
    let mut cmd = Command::new(&cargo);
    cmd.current_dir(&root)
        .args([
            "build",
            "--locked",
            "--profile",
            "guest",
            "--target",
            "wasm32-wasip2",
            "--target-dir",
        ])
        .arg(&target_dir);
    for guest in &guests {
        cmd.args(["-p", &guest.package]);
    }
    for var in [
        "CARGO_ENCODED_RUSTFLAGS",
        "RUSTFLAGS",
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET",
        "RUSTC_WORKSPACE_WRAPPER",
    ] {
        cmd.env_remove(var);
    }
    let status = cmd
        .status()
        .unwrap_or_else(|e| fail(&format!("cannot run cargo: {e}")));
    if !status.success() {
        fail(
            "building the guest components failed (is the wasm32-wasip2 target installed? `rustup target add wasm32-wasip2`)",
        );
    }

    let mut code = String::new();
    let mut test_guests = Vec::new();
    for Guest {
        package,
        constant,
        test,
    } in &guests
    {
        let file = target_dir
            .join("wasm32-wasip2/guest")
            .join(format!("{}.wasm", package.replace('-', "_")));
        if !Path::new(&file).is_file() {
            fail(&format!("expected {} after the build", file.display()));
        }
        let _ = writeln!(
            code,
            "/// Path of the `{package}` component.\npub const {constant}: &str = {:?};",
            file.display().to_string()
        );
        if *test {
            test_guests.push(package.trim_start_matches("guest-").replace('-', "_"));
        }
    }
    let _ = writeln!(
        code,
        "/// Calls `$mac!(name)` for every test guest, so each must have a host test.\n#[macro_export]\nmacro_rules! foreach_test_guest {{ ($mac:ident) => {{ {} }}; }}",
        test_guests
            .iter()
            .map(|g| format!("$mac!({g});"))
            .collect::<String>()
    );
    if let Err(e) = std::fs::write(out.join("guests.rs"), code) {
        fail(&format!("cannot write guests.rs: {e}"));
    }
}

fn fail(msg: &str) -> ! {
    eprintln!("error: {msg}");
    std::process::exit(1)
}
