//! A real Docker Engine (Debian `docker.io`) for the tests, on a unix socket in its own temp
//! directory: its own data root, exec root and pid file, the vfs storage driver, and no
//! iptables or bridge, so it touches nothing of the host's networking. Stopped on drop.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// One dockerd.
pub struct Dockerd {
    dir: tempfile::TempDir,
    child: Child,
}

impl Dockerd {
    /// Starts dockerd and waits until its socket answers.
    pub fn start() -> Dockerd {
        let dir = tempfile::tempdir().expect("dockerd dir");
        let d = dir.path();
        let log = std::fs::File::create(d.join("dockerd.log")).expect("dockerd log");
        let child = Command::new("dockerd")
            .arg("-H")
            .arg(format!("unix://{}", d.join("docker.sock").display()))
            .arg("--data-root")
            .arg(d.join("data"))
            .arg("--exec-root")
            .arg(d.join("exec"))
            .arg("--pidfile")
            .arg(d.join("dockerd.pid"))
            .args(["--storage-driver=vfs", "--iptables=false", "--bridge=none"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("dockerd (scripts/test.sh installs docker.io)");
        let dockerd = Dockerd { dir, child };
        let start = Instant::now();
        while std::os::unix::net::UnixStream::connect(dockerd.socket()).is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "dockerd did not start: {}",
                dockerd.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        dockerd
    }

    /// Its API socket.
    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("docker.sock")
    }

    /// Its log, for failure messages.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("dockerd.log")).unwrap_or_default()
    }
}

/// A FROM-scratch image as a tar stream for `POST /images/create?fromSrc=-`: Debian's static
/// busybox as `/bin/busybox`, with `/bin/sh` and the applets the tests use linked to it.
pub fn busybox_rootfs_tar() -> Vec<u8> {
    let root = tempfile::tempdir().expect("rootfs dir");
    let bin = root.path().join("bin");
    std::fs::create_dir_all(&bin).expect("bin");
    std::fs::copy("/bin/busybox", bin.join("busybox"))
        .expect("/bin/busybox (scripts/test.sh installs busybox-static)");
    for applet in ["sh", "echo", "cat", "sleep", "ls", "env", "hostname"] {
        std::os::unix::fs::symlink("busybox", bin.join(applet)).expect("applet link");
    }
    std::fs::create_dir_all(root.path().join("tmp")).expect("tmp");
    let out = Command::new("tar")
        .arg("-C")
        .arg(root.path())
        .args(["-c", "."])
        .output()
        .expect("tar");
    assert!(out.status.success(), "tar failed");
    out.stdout
}

impl Drop for Dockerd {
    fn drop(&mut self) {
        // SIGTERM lets dockerd stop its containerd; a dockerd already gone is fine.
        let _ = Command::new("kill")
            .arg(self.child.id().to_string())
            .status();
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill(); // it did not stop in time
        let _ = self.child.wait(); // reap it
    }
}
