use super::*;
use flotilla_plugin_runtime::LoadError;
use std::path::Path;

fn write(name: &str, bytes: &[u8]) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("flotilla-load-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap_or_else(|e| panic!("{e}"));
    path
}

fn wat(text: &str) -> Vec<u8> {
    wat::parse_str(text).unwrap_or_else(|e| panic!("{e}"))
}

fn load_err(path: &Path) -> LoadError {
    match common::runtime().load_file(path) {
        Ok(_) => panic!("{} loaded", path.display()),
        Err(e) => e,
    }
}

#[test]
fn bad_files_get_clear_errors() {
    let missing = load_err(Path::new("/nonexistent/plugin.wasm"));
    assert!(
        matches!(missing, LoadError::Unreadable { .. })
            && missing.to_string().contains("/nonexistent/plugin.wasm")
    );
    let empty = load_err(&write("empty.wasm", b""));
    assert!(empty.to_string().contains("empty"), "{empty}");
    let text = load_err(&write("text.wasm", b"#!/bin/sh\necho hi\n"));
    assert!(
        text.to_string().contains("not a WebAssembly binary"),
        "{text}"
    );
    let core = load_err(&write("core.wasm", &wat("(module (func (export \"f\")))")));
    assert!(
        matches!(core, LoadError::CoreModule { .. })
            && core.to_string().contains("core WebAssembly module"),
        "{core}"
    );
    let garbage = load_err(&write("garbage.wasm", b"\0asm\x0d\0\x01\0garbage"));
    assert!(matches!(garbage, LoadError::Invalid { .. }), "{garbage}");
}

#[test]
fn foreign_imports_are_named() {
    let e = load_err(&write(
        "kv.wasm",
        &wat(r#"(component (import "wasi:keyvalue/store@0.2.0" (instance)))"#),
    ));
    assert!(
        matches!(e, LoadError::ForbiddenImport { ref import, .. } if import == "wasi:keyvalue/store@0.2.0"),
        "{e}"
    );
    assert!(e.to_string().contains("`wasi:keyvalue/store@0.2.0`"), "{e}");
    let e = load_err(&write(
        "inc.wasm",
        &wat(r#"(component (import "wasi:http/incoming-handler@0.2.12" (instance)))"#),
    ));
    assert!(e.to_string().contains("wasi:http/incoming-handler"), "{e}");
    let e = load_err(&write(
        "func.wasm",
        &wat(r#"(component (import "exec" (func)))"#),
    ));
    assert!(e.to_string().contains("`exec`"), "{e}");
}

#[test]
fn wrong_world_or_version_is_rejected() {
    let e = load_err(&write("none.wasm", &wat("(component)")));
    assert!(
        matches!(e, LoadError::MissingExport { .. }) && e.to_string().contains("exports nothing"),
        "{e}"
    );
    let v2 = wat(
        r#"(component (instance $i) (export "flotilla:provider/instance-group@0.2.0" (instance $i)))"#,
    );
    let e = load_err(&write("v2.wasm", &v2));
    assert!(e.to_string().contains("instance-group@0.2.0"), "{e}");
    let log2 = wat(r#"(component (import "flotilla:provider/log@0.2.0" (instance)))"#);
    let e = load_err(&write("log2.wasm", &log2));
    assert!(e.to_string().contains("0.1.4"), "{e}");
    let hollow = wat(
        r#"(component (instance $i) (export "flotilla:provider/instance-group@0.1.0" (instance $i)))"#,
    );
    let e = load_err(&write("hollow.wasm", &hollow));
    assert!(matches!(e, LoadError::ContractMismatch { .. }), "{e}");
}

/// A load from the cache skips reading and hashing a file whose identity (device, inode,
/// size, mtime, ctime) is unchanged; any change to the file is hashed again, so the
/// digest always names the bytes on disk.
#[test]
fn the_digest_follows_the_file_even_when_hashing_is_skipped() {
    use flotilla_plugin_runtime::{CacheOutcome, PluginRuntime, RuntimeOptions};
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let rt = PluginRuntime::new(RuntimeOptions {
        cache_dir: Some(dir.path().join("cache")),
    })
    .unwrap_or_else(|e| panic!("{e}"));
    let path = dir.path().join("plugin.wasm");
    let digest =
        |p: &str| flotilla_net::sha256_hex(&std::fs::read(p).unwrap_or_else(|e| panic!("{e}")));
    std::fs::copy(guests::STATIC_PLUGIN, &path).unwrap_or_else(|e| panic!("{e}"));
    let load = || rt.load_file(&path).unwrap_or_else(|e| panic!("{e}"));
    let first = load();
    assert_eq!(first.sha256, digest(guests::STATIC_PLUGIN));
    let again = load();
    assert_eq!(
        (again.sha256.as_str(), again.cache),
        (first.sha256.as_str(), CacheOutcome::Hit)
    );
    assert_eq!(again.size, first.size);
    // Replaced in place by another plugin: read and hashed again.
    std::fs::copy(guests::TEMPLATE_PLUGIN, &path).unwrap_or_else(|e| panic!("{e}"));
    let replaced = load();
    assert_eq!(replaced.sha256, digest(guests::TEMPLATE_PLUGIN));
    assert_ne!(replaced.sha256, first.sha256);
    // Back to the first bytes: the digest follows again (and its compiled code is reused).
    std::fs::copy(guests::STATIC_PLUGIN, &path).unwrap_or_else(|e| panic!("{e}"));
    let back = load();
    assert_eq!(
        (back.sha256.as_str(), back.cache),
        (first.sha256.as_str(), CacheOutcome::Hit)
    );
    // A record that names another digest for the file's current identity is believed only
    // while that identity holds: touching the file (new ctime) makes it hash again.
    let records = dir.path().join("cache").join("by-path");
    for r in std::fs::read_dir(&records)
        .unwrap_or_else(|e| panic!("{e}"))
        .flatten()
    {
        let text = std::fs::read_to_string(r.path()).unwrap_or_else(|e| panic!("{e}"));
        let (identity, _) = text.split_once('\n').unwrap_or_else(|| panic!("{text}"));
        std::fs::write(r.path(), format!("{identity}\n{}", replaced.sha256))
            .unwrap_or_else(|e| panic!("{e}"));
    }
    let f = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap_or_else(|e| panic!("{e}"));
    f.set_modified(std::time::SystemTime::now())
        .unwrap_or_else(|e| panic!("{e}"));
    drop(f);
    assert_eq!(load().sha256, first.sha256);
}

#[test]
fn compile_cache_skips_the_second_compile() {
    use flotilla_plugin_runtime::{CacheOutcome, PluginRuntime, RuntimeOptions};
    let dir = std::env::temp_dir().join(format!("flotilla-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let open = || {
        PluginRuntime::new(RuntimeOptions {
            cache_dir: Some(dir.clone()),
        })
        .unwrap_or_else(|e| panic!("{e}"))
    };
    let first = open()
        .load_file(Path::new(guests::STATIC_PLUGIN))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        matches!(first.cache, CacheOutcome::Compiled { .. }),
        "{:?}",
        first.cache
    );
    let second = open()
        .load_file(Path::new(guests::STATIC_PLUGIN))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(second.cache, CacheOutcome::Hit);
    // A corrupt entry is discarded and recompiled, never trusted. (Replace, never truncate,
    // a file that may be memory-mapped: that is how the cache itself writes.)
    drop((first, second));
    for entry in std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{e}"))
        .flatten()
        .filter(|e| e.path().is_file())
    {
        let tmp = entry.path().with_extension("tmp");
        std::fs::write(&tmp, b"corrupt").unwrap_or_else(|e| panic!("{e}"));
        std::fs::rename(&tmp, entry.path()).unwrap_or_else(|e| panic!("{e}"));
    }
    let third = open()
        .load_file(Path::new(guests::STATIC_PLUGIN))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        matches!(third.cache, CacheOutcome::Compiled { .. }),
        "{:?}",
        third.cache
    );
    let _ = std::fs::remove_dir_all(&dir);
}
