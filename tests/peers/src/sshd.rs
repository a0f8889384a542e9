//! Debian's `openssh-server` as a loopback "machine": one `sshd` per port, with its own config,
//! host key and authorized keys, started as its own daemon (no systemd). Stopped on drop.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::poll;

/// One sshd on a loopback address (127.0.0.1 unless started with [`Sshd::start_at`]).
pub struct Sshd {
    pub dir: tempfile::TempDir,
    /// The loopback address it listens on.
    pub address: String,
    pub port: u16,
    extra: String,
    /// A socket of this machine's own, bound over a path every machine shares: `(own, at)`.
    engine: Option<(PathBuf, PathBuf)>,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

fn run(cmd: &mut Command) {
    let out = cmd.output().expect("run a command");
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Sshd {
    /// Starts a machine that lets in the holder of `authorized_key` (an OpenSSH public key
    /// line), as root.
    pub fn start(authorized_key: &str) -> Sshd {
        Sshd::start_with(authorized_key, "")
    }

    /// A machine whose `sshd_config` also has `extra` (e.g. `MaxSessions 2\n`).
    pub fn start_with(authorized_key: &str, extra: &str) -> Sshd {
        Sshd::start_full(authorized_key, extra, None)
    }

    /// A machine whose sessions see the socket `own` at the path `at` (in a mount namespace of
    /// its own, root only), so machines configured with one engine path each reach an engine
    /// of their own, as real machines do.
    pub fn start_with_engine(authorized_key: &str, own: &Path, at: &Path) -> Sshd {
        Sshd::start_full(
            authorized_key,
            "",
            Some((own.to_path_buf(), at.to_path_buf())),
        )
    }

    /// A machine listening on `address:port` (any address of 127.0.0.0/8: Linux answers them
    /// all on the loopback interface), so several machines can share one SSH port as a
    /// cloud's instances do, each at its own address; with `engine` as in
    /// [`Sshd::start_with_engine`].
    pub fn start_at(
        authorized_key: &str,
        address: &str,
        port: u16,
        engine: Option<(&Path, &Path)>,
    ) -> Sshd {
        Sshd::start_on(
            authorized_key,
            "",
            engine.map(|(own, at)| (own.to_path_buf(), at.to_path_buf())),
            (address.to_string(), port),
        )
    }

    /// A free port on 127.0.0.1, for machines that share one ([`Sshd::start_at`]).
    pub fn free_port() -> u16 {
        free_port()
    }

    fn start_full(authorized_key: &str, extra: &str, engine: Option<(PathBuf, PathBuf)>) -> Sshd {
        Sshd::start_on(
            authorized_key,
            extra,
            engine,
            ("127.0.0.1".to_string(), free_port()),
        )
    }

    fn start_on(
        authorized_key: &str,
        extra: &str,
        engine: Option<(PathBuf, PathBuf)>,
        (address, port): (String, u16),
    ) -> Sshd {
        let dir = tempfile::tempdir().expect("sshd dir");
        std::fs::create_dir_all("/run/sshd").expect("the privilege separation directory");
        std::fs::write(
            dir.path().join("authorized_keys"),
            format!("{authorized_key}\n"),
        )
        .expect("authorized_keys");
        let sshd = Sshd {
            dir,
            address,
            port,
            extra: extra.to_string(),
            engine,
        };
        sshd.new_host_key();
        sshd.launch();
        sshd
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Replaces the host key file (takes effect at the next launch).
    pub fn new_host_key(&self) {
        let key = self.path("hostkey");
        let _ = std::fs::remove_file(&key); // absent on the first call
        let _ = std::fs::remove_file(self.path("hostkey.pub")); // likewise
        run(Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-f"])
            .arg(&key));
    }

    fn launch(&self) {
        let d = self.dir.path().display();
        // The login user's home is the machine's own (`SetEnv HOME`), as a real machine's is
        // not this host's: the shells of its sessions read no startup file of the user running
        // the tests (one that runs a tool manager at every shell start, which a killed job can
        // leave holding its lock, would hold every later session up).
        std::fs::create_dir_all(self.path("home")).expect("the machine's home");
        let config = format!(
            "Port {port}\nListenAddress {address}\nHostKey {d}/hostkey\nPidFile {d}/sshd.pid\n\
             AuthorizedKeysFile {d}/authorized_keys\nPasswordAuthentication no\n\
             KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n\
             AllowStreamLocalForwarding yes\nAllowTcpForwarding yes\n\
             PermitRootLogin prohibit-password\nSetEnv HOME={d}/home\n{extra}",
            port = self.port,
            address = self.address,
            extra = self.extra,
        );
        std::fs::write(self.path("sshd_config"), config).expect("sshd_config");
        match &self.engine {
            None => run(Command::new("/usr/sbin/sshd")
                .arg("-f")
                .arg(self.path("sshd_config"))
                .arg("-E")
                .arg(self.path("sshd.log"))),
            Some((own, at)) => {
                if !at.exists() {
                    std::fs::write(at, b"").expect("the shared socket path");
                }
                run(Command::new("unshare")
                    .args(["--mount", "--propagation", "private", "sh", "-c"])
                    .arg("mount --bind \"$0\" \"$1\" && exec /usr/sbin/sshd -f \"$2\" -E \"$3\"")
                    .arg(own)
                    .arg(at)
                    .arg(self.path("sshd_config"))
                    .arg(self.path("sshd.log")));
            }
        }
        poll::until_blocking("sshd to start", Duration::from_secs(10), || {
            std::net::TcpStream::connect((self.address.as_str(), self.port))
                .map_err(|e| format!("{e}\n{}", self.log()))
        });
    }

    /// Stops the daemon and every session it started, as a machine that dies would.
    pub fn stop(&self) {
        // The listener, its sessions and their commands die together: a client that
        // reconnects at once must not find a listener still accepting after its sessions died
        // (it did, and a job ran on through a "dead" machine).
        // The pid file goes with it: a second stop (the drop after a test's) must not find the
        // number again once another process has been given it.
        let pid_file = self.path("sshd.pid");
        if let Some(pid) = std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|p| p.trim().parse::<u32>().ok())
            .filter(|pid| self.is_ours(*pid))
        {
            crate::process::kill_tree(pid);
        }
        let _ = std::fs::remove_file(&pid_file); // absent when already stopped
        let start = Instant::now();
        while std::net::TcpStream::connect((self.address.as_str(), self.port)).is_ok()
            && start.elapsed() < Duration::from_secs(5)
        {
            // Deliberate: the poll interval of a wait that `drop` runs too, so it gives up
            // quietly where poll::until_blocking would panic.
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The listener's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        std::fs::read_to_string(self.path("sshd.pid"))
            .ok()
            .and_then(|p| p.trim().parse::<u32>().ok())
            .filter(|pid| self.is_ours(*pid))
    }

    /// Whether `pid` is this machine's listener: its command line names this config file.
    /// (sshd rewrites its title into one string, `sshd: /usr/sbin/sshd -f <config> ...`.)
    fn is_ours(&self, pid: u32) -> bool {
        let config = self.path("sshd_config").display().to_string();
        std::fs::read(format!("/proc/{pid}/cmdline"))
            .is_ok_and(|cmd| String::from_utf8_lossy(&cmd).contains(&config))
    }

    /// Stops and starts again on the same port (e.g. after [`Sshd::new_host_key`]).
    pub fn restart(&self) {
        self.stop();
        self.launch();
    }

    /// The daemon's log, for failure messages.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.path("sshd.log")).unwrap_or_default()
    }

    /// A file in the machine's directory (for ready commands to create).
    pub fn file(&self, name: &str) -> PathBuf {
        self.path(name)
    }

    /// The directory.
    pub fn root(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Sshd {
    fn drop(&mut self) {
        self.stop();
    }
}
