//! The address stand-in servers bind when containers must reach them: a container on a
//! Docker bridge cannot reach the host's loopback (its packets to 127.0.0.0/8 are martians),
//! so the peers a job's helper container talks to (the git server, GitLab's jobs API, the
//! cache stores) listen on [`PEER_IP`], an address of TEST-NET-1 (RFC 5737, never routed)
//! added to this machine's loopback interface. A container reaches it through its bridge's
//! gateway, as local delivery on the host (Linux takes a packet for any of its addresses on
//! any interface, and only 127.0.0.0/8 is refused from outside `lo`); nothing outside the
//! machine can, as no route leads there.

use std::net::{IpAddr, Ipv4Addr};
use std::process::Command;

/// The peers' address on the loopback interface.
pub const PEER_IP: IpAddr = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 77));

/// Makes sure [`PEER_IP`] is an address of this machine (added to `lo` as root the first
/// time; later calls find it) and returns it; `None` when that is not possible here (not
/// root, no `ip`), so a test can say it is skipped.
pub fn peer_ip() -> Option<IpAddr> {
    static READY: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let ready = *READY.get_or_init(|| {
        if bindable() {
            return true;
        }
        let ip = |args: &[&str]| {
            Command::new("ip")
                .args(args)
                .output()
                .map(|o| o.status.success())
                .unwrap_or(false)
        };
        // Another test process may race to add it: then this add fails, and it is there.
        ip(&["addr", "add", &format!("{PEER_IP}/32"), "dev", "lo"]);
        bindable()
    });
    ready.then_some(PEER_IP)
}

/// Whether a socket can bind [`PEER_IP`] (it is one of this machine's addresses).
fn bindable() -> bool {
    std::net::TcpListener::bind((PEER_IP, 0)).is_ok()
}
