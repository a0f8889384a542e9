//! Builds the official plugins for wasm32-wasip2 with the workspace's `guest` profile, copies
//! them into OUT_DIR and writes the table `src/lib.rs` includes. The list of built-in plugins
//! is [`BUILTIN`], here and nowhere else.

use std::env;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::Command;

#[path = "target_root.rs"]
mod target_root;

/// (name after `builtin:`, workspace package).
const BUILTIN: &[(&str, &str)] = &[
    ("aws", "flotilla-plugin-aws"),
    ("azure", "flotilla-plugin-azure"),
    ("gcp", "flotilla-plugin-gcp"),
    ("static", "flotilla-plugin-static"),
];

fn main() {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap_or_default());
    let root = manifest
        .join("../..")
        .canonicalize()
        .unwrap_or_else(|e| fail(&format!("workspace root: {e}")));
    let out = PathBuf::from(env::var("OUT_DIR").unwrap_or_else(|_| fail("OUT_DIR is not set")));
    // OUT_DIR is <target>/[<triple>/]<profile>/build/<pkg>-<hash>/out; the guests go beside the
    // profiles in the same place tests/artifacts puts them, so neither builds them twice.
    let target_dir = target_root::of(&out).join("wasm-guests");
    for path in ["plugins", "guest", "wit", "Cargo.lock"] {
        println!("cargo:rerun-if-changed={}", root.join(path).display());
    }

    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
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
    for (_, package) in BUILTIN {
        cmd.args(["-p", package]);
    }
    // The host's build settings (a cross target, its flags, a wrapper) are not the guests'.
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
            "building the built-in plugins failed (is the wasm32-wasip2 target installed? `rustup target add wasm32-wasip2`)",
        );
    }

    let mut table = String::from("&[\n");
    for (name, package) in BUILTIN {
        let built = target_dir
            .join("wasm32-wasip2/guest")
            .join(format!("{}.wasm", package.replace('-', "_")));
        let copy = out.join(format!("{name}.wasm"));
        if let Err(e) = std::fs::copy(&built, &copy) {
            fail(&format!("{}: {e}", built.display()));
        }
        let _ = writeln!(
            table,
            "    Builtin {{ name: {name:?}, package: {package:?}, bytes: include_bytes!({:?}) }},",
            copy.display().to_string()
        );
    }
    table.push(']');
    if let Err(e) = std::fs::write(out.join("builtin.rs"), table) {
        fail(&format!("cannot write builtin.rs: {e}"));
    }
}

fn fail(msg: &str) -> ! {
    eprintln!("error: {msg}");
    std::process::exit(1)
}
