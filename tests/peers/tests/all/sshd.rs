//! The loopback machine dies as a real one does: after `stop`, no session of it is left, not
//! even one its listener accepted while it was being stopped.

use std::io::Read;
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use flotilla_peers::sshd::Sshd;

/// A client that reconnects at once: it opens connection after connection while the machine
/// is stopped, as the host does when its session breaks. Any connection still served after
/// `stop` returned is a session that outlived its machine. (With the listener killed after its
/// children, one such session carried a CI job on for 300 s through a "dead" machine.)
#[test]
fn a_stopped_machine_serves_no_connection_opened_while_it_died() {
    let sshd = Sshd::start("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOnlyTheListenerMatters test");
    let port = sshd.port;
    let done = Arc::new(AtomicBool::new(false));
    let hammer = {
        let done = done.clone();
        std::thread::spawn(move || {
            let mut held = Vec::new();
            while !done.load(Ordering::Relaxed) && held.len() < 2_000 {
                if let Ok(s) = TcpStream::connect(("127.0.0.1", port)) {
                    held.push(s);
                }
                // Deliberate: pacing, so connections keep coming through the stop.
                std::thread::sleep(Duration::from_micros(200));
            }
            held
        })
    };
    // Deliberate: lets the client open connections before and while the machine dies.
    std::thread::sleep(Duration::from_millis(300));
    sshd.stop();
    done.store(true, Ordering::Relaxed);
    let held = hammer.join().expect("the client thread");
    assert!(
        held.len() > 10,
        "the client opened {} connections",
        held.len()
    );
    let mut served = 0;
    let n = held.len();
    for mut s in held {
        s.set_read_timeout(Some(Duration::from_secs(2)))
            .expect("a read timeout");
        let mut sink = Vec::new();
        // End of stream or a reset: the connection died with the machine. A timeout: a
        // process still holds it open.
        if let Err(e) = s.read_to_end(&mut sink)
            && matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            )
        {
            served += 1;
        }
    }
    assert_eq!(
        served, 0,
        "of {n} connections, some are still served after the machine stopped"
    );
    assert!(
        TcpStream::connect(("127.0.0.1", port)).is_err(),
        "the port still accepts"
    );
}
