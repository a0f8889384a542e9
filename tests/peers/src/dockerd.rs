//! A real Docker Engine (Debian `docker.io`) for the tests, on a unix socket in its own temp
//! directory: its own data root, exec root and pid file, the overlay2 storage driver (vfs,
//! which copies every image for every container, where the kernel or the data root's
//! filesystem refuses overlay2), and no iptables or bridge, so it touches nothing of the
//! host's networking. Stopped on drop.
//!
//! Its user networks take their subnets from a /16 of its own ([`AddressPool`]): the engines of
//! tests running at once share the host's routing table, where Docker's default pools (31
//! subnets in all) run out, and a bridge outlives an engine killed before it removed it.
//!
//! [`Dockerd::start_with_iptables`] runs one as Docker runs by default, with its iptables
//! rules (the isolation between networks), inside a network namespace of its own (made with
//! `ip netns`, entered with `nsenter` so the mounts stay the host's): its rules never touch the
//! host's, and it reaches nothing on the host's loopback, so its images are imported.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::poll;

/// One dockerd.
pub struct Dockerd {
    dir: tempfile::TempDir,
    child: Child,
    /// The network namespace it runs in, removed on drop.
    netns: Option<String>,
    /// The `--tlsverify` TCP port, when started with TLS.
    pub tls_port: Option<u16>,
    /// Where its user networks' subnets come from (none in a namespace of its own).
    pool: Option<AddressPool>,
}

/// A /16 of 10.0.0.0/8 (`10.K.0.0/16`, K from 200 to 253) that one engine's user networks take
/// /24s from, held through an exclusive lock on a file so that engines of other test processes
/// never get it. Bridges left in it (by an engine killed before it removed them) are removed
/// when it is claimed and when its engine has stopped.
struct AddressPool {
    second_octet: u8,
    _lock: std::fs::File,
}

impl AddressPool {
    fn claim() -> AddressPool {
        for second_octet in 200..=253u8 {
            let path = std::env::temp_dir().join(format!("flotilla-dockerd-pool-{second_octet}"));
            let file = std::fs::File::create(&path).expect("a pool lock file");
            if file.try_lock().is_ok() {
                let pool = AddressPool {
                    second_octet,
                    _lock: file,
                };
                pool.remove_bridges();
                return pool;
            }
        }
        panic!("all 54 test address pools (10.200.0.0/16 to 10.253.0.0/16) are held");
    }

    /// dockerd's flag.
    fn flag(&self) -> String {
        format!(
            "--default-address-pool=base=10.{}.0.0/16,size=24",
            self.second_octet
        )
    }

    /// Removes the bridges with an address in the pool: no engine holds them.
    fn remove_bridges(&self) {
        let Ok(out) = Command::new("ip")
            .args(["-o", "-4", "addr", "show"])
            .output()
        else {
            return;
        };
        let prefix = format!("10.{}.", self.second_octet);
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            // "7: br-0123abcd    inet 10.200.0.1/24 brd 10.200.0.255 scope global br-0123abcd"
            let mut words = line.split_whitespace().skip(1);
            let (Some(link), Some("inet"), Some(address)) =
                (words.next(), words.next(), words.next())
            else {
                continue;
            };
            if link.starts_with("br-") && address.starts_with(&prefix) {
                let _ = Command::new("ip").args(["link", "del", link]).status(); // best effort
            }
        }
    }
}

/// A test PKI for Docker over TLS: one CA signing the engine's certificate (for 127.0.0.1) and
/// a client certificate, plus a client certificate from an unrelated CA. All PEM files in `dir`:
/// `ca.pem`, `server.pem`, `server-key.pem`, `client.pem`, `client-key.pem`, `stranger.pem`,
/// `stranger-key.pem` (keys 0600).
pub struct DockerPki {
    pub dir: tempfile::TempDir,
}

fn issue(
    issuer: &rcgen::Issuer<'_, rcgen::KeyPair>,
    names: Vec<String>,
    usage: rcgen::ExtendedKeyUsagePurpose,
) -> (rcgen::Certificate, rcgen::KeyPair) {
    let key = rcgen::KeyPair::generate().expect("a key");
    let mut params = rcgen::CertificateParams::new(names).expect("params");
    params.extended_key_usages = vec![usage];
    let cert = params.signed_by(&key, issuer).expect("a certificate");
    (cert, key)
}

fn ca(name: &str) -> (rcgen::Certificate, rcgen::Issuer<'static, rcgen::KeyPair>) {
    let key = rcgen::KeyPair::generate().expect("a CA key");
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    let cert = params.self_signed(&key).expect("a CA certificate");
    (cert, rcgen::Issuer::new(params, key))
}

impl DockerPki {
    /// Makes the files.
    pub fn new() -> DockerPki {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("pki dir");
        let write = |name: &str, text: String| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).expect("write a PEM file");
            if name.ends_with("-key.pem") {
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
                    .expect("chmod 600");
            }
        };
        let (ca_cert, issuer) = ca("flotilla test Docker CA");
        let server = rcgen::ExtendedKeyUsagePurpose::ServerAuth;
        let client = rcgen::ExtendedKeyUsagePurpose::ClientAuth;
        let (cert, key) = issue(
            &issuer,
            vec!["127.0.0.1".into(), "localhost".into()],
            server,
        );
        write("ca.pem", ca_cert.pem());
        write("server.pem", cert.pem());
        write("server-key.pem", key.serialize_pem());
        let (cert, key) = issue(&issuer, vec!["flotilla-pool".into()], client.clone());
        write("client.pem", cert.pem());
        write("client-key.pem", key.serialize_pem());
        let (_, other) = ca("some other CA");
        let (cert, key) = issue(&other, vec!["stranger".into()], client);
        write("stranger.pem", cert.pem());
        write("stranger-key.pem", key.serialize_pem());
        DockerPki { dir }
    }

    /// A file of the PKI.
    pub fn file(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

impl Default for DockerPki {
    fn default() -> Self {
        DockerPki::new()
    }
}

impl Dockerd {
    /// Starts dockerd and waits until its socket answers.
    pub fn start() -> Dockerd {
        Dockerd::launch(None, None)
    }

    /// Starts dockerd with iptables on, in a network namespace of its own.
    pub fn start_with_iptables() -> Dockerd {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("flotilla-test-{}-{n}", std::process::id());
        let ok = Command::new("ip")
            .args(["netns", "add", &name])
            .status()
            .expect("ip (iproute2)");
        assert!(ok.success(), "ip netns add {name}");
        Dockerd::launch(None, Some(name))
    }

    /// Starts dockerd with its unix socket and a `--tlsverify` TCP port on 127.0.0.1 that
    /// accepts clients of `pki`'s CA.
    pub fn start_tls(pki: &DockerPki) -> Dockerd {
        Dockerd::launch(Some(pki), None)
    }

    fn launch(pki: Option<&DockerPki>, netns: Option<String>) -> Dockerd {
        match Dockerd::try_launch(pki, netns.clone(), "overlay2") {
            Ok(dockerd) => dockerd,
            // overlay2 needs a kernel and a filesystem under the data root that allow it;
            // vfs works anywhere (it copies every layer for every container, so it is slower).
            Err(log) => Dockerd::try_launch(pki, netns, "vfs")
                .unwrap_or_else(|log2| panic!("dockerd did not start:\n{log}\n{log2}")),
        }
    }

    /// Starts dockerd with `storage_driver`; its log if it exits before its socket answers.
    fn try_launch(
        pki: Option<&DockerPki>,
        netns: Option<String>,
        storage_driver: &str,
    ) -> Result<Dockerd, String> {
        let dir = tempfile::tempdir().expect("dockerd dir");
        let d = dir.path();
        let log = std::fs::File::create(d.join("dockerd.log")).expect("dockerd log");
        let tls_port = pki.map(|_| {
            std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .map(|a| a.port())
                .expect("a free port")
        });
        let mut cmd = match &netns {
            Some(name) => {
                let mut c = Command::new("nsenter");
                c.arg(format!("--net=/run/netns/{name}")).arg("dockerd");
                c
            }
            None => Command::new("dockerd"),
        };
        let isolation: &[&str] = if netns.is_some() {
            &["--bridge=none"]
        } else {
            &["--iptables=false", "--bridge=none"]
        };
        let pool = netns.is_none().then(AddressPool::claim);
        if let Some(pool) = &pool {
            cmd.arg(pool.flag());
        }
        if let (Some(pki), Some(port)) = (pki, tls_port) {
            cmd.arg("-H")
                .arg(format!("tcp://127.0.0.1:{port}"))
                .arg("--tlsverify")
                .arg("--tlscacert")
                .arg(pki.file("ca.pem"))
                .arg("--tlscert")
                .arg(pki.file("server.pem"))
                .arg("--tlskey")
                .arg(pki.file("server-key.pem"));
        }
        let child = cmd
            .arg("-H")
            .arg(format!("unix://{}", d.join("docker.sock").display()))
            .arg("--data-root")
            .arg(d.join("data"))
            .arg("--exec-root")
            .arg(d.join("exec"))
            .arg("--pidfile")
            .arg(d.join("dockerd.pid"))
            .args(isolation)
            .arg(format!("--storage-driver={storage_driver}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("dockerd (scripts/test.sh installs docker.io)");
        let mut dockerd = Dockerd {
            dir,
            child,
            netns,
            tls_port,
            pool,
        };
        let exited = poll::until_blocking("dockerd to start", Duration::from_secs(30), || {
            if let Ok(Some(_)) = dockerd.child.try_wait() {
                return Ok(true);
            }
            std::os::unix::net::UnixStream::connect(dockerd.socket())
                .map(|_| false)
                .map_err(|e| format!("{e}\n{}", dockerd.log()))
        });
        if exited {
            let log = dockerd.log();
            // Nothing to stop: keep the namespace for the next try.
            dockerd.netns = None;
            return Err(log);
        }
        if let Some(port) = dockerd.tls_port {
            poll::until_blocking(
                "dockerd's TLS port to open",
                Duration::from_secs(30),
                || {
                    std::net::TcpStream::connect(("127.0.0.1", port))
                        .map_err(|e| format!("{e}\n{}", dockerd.log()))
                },
            );
        }
        Ok(dockerd)
    }

    /// Whether it runs in a network namespace of its own (it cannot reach the host's loopback).
    pub fn has_own_network(&self) -> bool {
        self.netns.is_some()
    }

    /// Its API socket.
    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("docker.sock")
    }

    /// The file holding dockerd's pid (to kill it as a crash would).
    pub fn pid_file(&self) -> PathBuf {
        self.dir.path().join("dockerd.pid")
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

impl Dockerd {
    /// Containers whose engine died under them (a test kills dockerd with SIGKILL) keep
    /// running under their containerd shims, which outlive the engine, and their overlay
    /// mounts keep the temp dir from being removed: each such test run left two containers
    /// and their mounts on the machine. Kills each shim of this engine (its command line names
    /// the engine's exec root) with the container's init, which takes the container's
    /// processes along (its own pid namespace), then lazily unmounts what is left under the
    /// temp dir. A no-op after a clean stop.
    fn stop_orphaned_containers(&self) {
        let pids = processes();
        for shim in self.shims() {
            let inits = pids.iter().filter(|&&p| parent_of(p) == Some(shim));
            for pid in inits.chain([&shim]) {
                let _ = Command::new("kill")
                    .args(["-KILL", &pid.to_string()])
                    .status();
            }
        }
        let root = self.dir.path().to_string_lossy().into_owned();
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        // The mount point is the fifth field; the deepest first.
        let mut under: Vec<&str> = mounts
            .lines()
            .filter_map(|l| l.split_whitespace().nth(4))
            .filter(|m| m.starts_with(root.as_str()))
            .collect();
        under.sort_by_key(|m| std::cmp::Reverse(m.len()));
        for mount in under {
            let _ = Command::new("umount").args(["-l", mount]).status();
        }
    }

    /// The pids of this engine's containerd shims: each keeps a container alive, and outlives
    /// an engine killed under it (its drop kills them; see [`running`]).
    pub fn shims(&self) -> Vec<u32> {
        let root = self.dir.path().to_string_lossy().into_owned();
        processes()
            .into_iter()
            .filter(|pid| {
                let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                let cmdline = String::from_utf8_lossy(&cmdline);
                cmdline.contains("containerd-shim") && cmdline.contains(root.as_str())
            })
            .collect()
    }
}

/// Whether a process runs: it exists and is not a zombie (killed, and not yet reaped by a
/// parent that may never reap it, as an init that reaps no orphans).
pub fn running(pid: u32) -> bool {
    stat_field(pid, 0).is_some_and(|state| state != "Z")
}

/// The pids in `/proc`.
fn processes() -> Vec<u32> {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    procs
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect()
}

/// A process's parent.
fn parent_of(pid: u32) -> Option<u32> {
    stat_field(pid, 1)?.parse().ok()
}

/// Field `n` after the command name of `/proc/PID/stat` (`pid (comm) state ppid ...`: 0 is the
/// state, 1 the parent), split after comm's `)`, as comm may hold spaces.
fn stat_field(pid: u32, n: usize) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    Some(
        stat.rsplit_once(')')?
            .1
            .split_whitespace()
            .nth(n)?
            .to_string(),
    )
}

impl Drop for Dockerd {
    fn drop(&mut self) {
        if self.netns.is_none() {
            // A user network's bridge outlives dockerd (its data root is a temp dir, so no
            // later dockerd removes it), and enough of them exhaust Docker's address pools
            // on this machine: remove the containers and networks while the engine answers.
            let cli = |args: &[&str]| {
                Command::new("docker")
                    .arg("-H")
                    .arg(format!("unix://{}", self.socket().display()))
                    .args(args)
                    .output()
            };
            if let Ok(out) = cli(&["ps", "-aq"]) {
                let ids: Vec<String> = String::from_utf8_lossy(&out.stdout)
                    .split_whitespace()
                    .map(str::to_string)
                    .collect();
                if !ids.is_empty() {
                    let mut args = vec!["rm", "-f"];
                    args.extend(ids.iter().map(String::as_str));
                    let _ = cli(&args); // best effort: the engine is going away
                }
            }
            let _ = cli(&["network", "prune", "-f"]); // likewise
        }
        // SIGTERM lets dockerd stop its containerd; a dockerd already gone is fine.
        let _ = Command::new("kill")
            .arg(self.child.id().to_string())
            .status();
        let deadline = Instant::now() + Duration::from_secs(15);
        let mut stopped = false;
        while !stopped && Instant::now() < deadline {
            stopped = matches!(self.child.try_wait(), Ok(Some(_)));
            if !stopped {
                // Deliberate: the poll interval of a wait in `drop`, which falls back to SIGKILL
                // where poll::until_blocking would panic.
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        if !stopped {
            let _ = self.child.kill(); // it did not stop in time
            let _ = self.child.wait(); // reap it
        }
        self.stop_orphaned_containers();
        if let Some(pool) = &self.pool {
            pool.remove_bridges();
        }
        if let Some(name) = &self.netns {
            // Takes the engine's bridges and rules along.
            let _ = Command::new("ip").args(["netns", "del", name]).status();
        }
    }
}
