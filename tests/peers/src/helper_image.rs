//! A stand-in for GitLab's `gitlab-runner-helper` image, built FROM scratch (no image
//! registry is reachable here): Debian's static busybox with every applet, Debian's bash and
//! git (with `git-remote-http`, `git submodule` and every library `ldd` names), the CA roots (plus any extra
//! CA a test's peers use), and the stand-in `gitlab-runner-helper` binary of this crate
//! (`src/bin/gitlab-runner-helper`) at `/usr/bin/gitlab-runner-helper`, as the official image
//! ships it (`dockerfiles/runner-helper/Dockerfile` in GitLab Runner: only that name, no
//! `gitlab-runner`).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The stand-in helper binary, built beside the test binary running this (the workspace's
/// test run builds every member's binaries); built on demand when a single crate's test run
/// did not.
pub fn binary() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    // target/<profile>/deps/<test binary>
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("the test binary sits in target/<profile>/deps")
        .to_path_buf();
    let binary = profile_dir.join("gitlab-runner-helper");
    if !binary.exists() {
        let profile = profile_dir
            .file_name()
            .and_then(|n| n.to_str())
            .map(|n| if n == "debug" { "dev" } else { n })
            .expect("a profile directory")
            .to_string();
        let target = profile_dir.parent().expect("the target directory");
        let built = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .args([
                "build",
                "-p",
                "flotilla-peers",
                "--bin",
                "gitlab-runner-helper",
            ])
            .args(["--profile", &profile])
            .env("CARGO_TARGET_DIR", target)
            .status()
            .expect("cargo");
        assert!(
            built.success(),
            "building the stand-in gitlab-runner-helper"
        );
    }
    binary
}

/// The files `ldd` says `program` needs (the loader included).
fn libraries(program: &Path) -> Vec<PathBuf> {
    let out = Command::new("ldd").arg(program).output().expect("ldd");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| {
            let line = line.trim();
            let path = match line.split_once("=>") {
                Some((_, after)) => after.split_whitespace().next()?,
                None => line.split_whitespace().next()?,
            };
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect()
}

/// Copies `from` into `root` at the same absolute path (following symlinks), mode kept.
fn place(root: &Path, from: &Path) {
    let to = root.join(from.strip_prefix("/").expect("an absolute path"));
    if to.exists() {
        return;
    }
    std::fs::create_dir_all(to.parent().expect("a parent")).expect("dirs");
    std::fs::copy(from, &to).unwrap_or_else(|e| panic!("copy {}: {e}", from.display()));
}

/// The image as a tar stream for `docker import`: see the module doc. `extra_ca` PEM is
/// appended to the CA roots.
pub fn rootfs_tar(helper: &Path, extra_ca: Option<&str>) -> Vec<u8> {
    // Built once per test process when it trusts no extra CA: every fleet imports the same.
    static PLAIN: std::sync::OnceLock<(PathBuf, Vec<u8>)> = std::sync::OnceLock::new();
    if extra_ca.is_some() {
        return tar(rootfs(helper, extra_ca).path());
    }
    let (built_from, bytes) =
        PLAIN.get_or_init(|| (helper.to_path_buf(), tar(rootfs(helper, None).path())));
    if built_from == helper {
        bytes.clone()
    } else {
        tar(rootfs(helper, None).path())
    }
}

/// A directory as a tar stream for `docker import`.
pub fn tar(root: &Path) -> Vec<u8> {
    let out = Command::new("tar")
        .arg("-C")
        .arg(root)
        .args(["-c", "."])
        .output()
        .expect("tar");
    assert!(out.status.success(), "tar failed");
    out.stdout
}

/// The image's root directory, for a test to change before [`tar`].
pub fn rootfs(helper: &Path, extra_ca: Option<&str>) -> tempfile::TempDir {
    let root = tempfile::tempdir().expect("rootfs dir");
    let r = root.path();
    for dir in [
        "bin",
        "tmp",
        "etc/ssl/certs",
        "usr/bin",
        "usr/local/bin",
        "root",
    ] {
        std::fs::create_dir_all(r.join(dir)).expect("dir");
    }
    std::fs::copy("/bin/busybox", r.join("bin/busybox"))
        .expect("/bin/busybox (scripts/test.sh installs busybox-static)");
    let applets = Command::new("/bin/busybox")
        .arg("--list")
        .output()
        .expect("busybox --list");
    for applet in String::from_utf8_lossy(&applets.stdout).split_whitespace() {
        if applet != "busybox" {
            let _ = std::os::unix::fs::symlink("busybox", r.join("bin").join(applet));
        }
    }
    // git's shell-script commands (`git submodule`) and what they source run on busybox.
    let programs = [
        "/bin/bash",
        "/usr/bin/git",
        "/usr/lib/git-core/git-remote-http",
        "/usr/lib/git-core/git-sh-i18n--envsubst",
    ];
    for script in ["git-submodule", "git-sh-setup", "git-sh-i18n"] {
        place(r, &Path::new("/usr/lib/git-core").join(script));
    }
    for program in programs {
        place(r, Path::new(program));
        for library in libraries(Path::new(program)) {
            place(r, &library);
        }
    }
    std::os::unix::fs::symlink(
        "git-remote-http",
        r.join("usr/lib/git-core/git-remote-https"),
    )
    .expect("git-remote-https");
    std::fs::copy(helper, r.join("usr/bin/gitlab-runner-helper")).expect("the helper binary");
    for library in libraries(helper) {
        place(r, &library);
    }
    let mut roots =
        std::fs::read_to_string("/etc/ssl/certs/ca-certificates.crt").unwrap_or_default();
    if let Some(pem) = extra_ca {
        roots.push_str(pem);
    }
    std::fs::write(r.join("etc/ssl/certs/ca-certificates.crt"), roots).expect("CA roots");
    std::fs::write(r.join("etc/passwd"), "root:x:0:0:root:/root:/bin/sh\n").expect("passwd");
    std::fs::write(r.join("etc/group"), "root:x:0:\n").expect("group");
    root
}
