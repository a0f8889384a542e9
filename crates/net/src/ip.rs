//! Address classes: which resolved addresses a plugin may not reach unless its pool lists the
//! range. This module classifies; the egress hook decides and reports.

use std::net::IpAddr;

/// Why an address is refused unless the pool allows its range explicitly.
pub fn blocked_reason(ip: IpAddr) -> Option<&'static str> {
    let ip = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    };
    match ip {
        IpAddr::V4(v4) => {
            let o = v4.octets();
            if v4.is_unspecified() || o[0] == 0 {
                Some("unspecified")
            } else if v4.is_loopback() {
                Some("loopback")
            } else if v4.is_link_local() {
                Some("link-local (includes the cloud metadata service)")
            } else if v4.is_private() {
                Some("private")
            } else if o[0] == 100 && (o[1] & 0xc0) == 64 {
                Some("shared address space (CGNAT)")
            } else if v4.is_broadcast() || v4.is_multicast() {
                Some("broadcast or multicast")
            } else {
                None
            }
        }
        IpAddr::V6(v6) => {
            let first = v6.segments()[0];
            if v6.is_unspecified() {
                Some("unspecified")
            } else if v6.is_loopback() {
                Some("loopback")
            } else if (first & 0xffc0) == 0xfe80 {
                Some("link-local")
            } else if (first & 0xfe00) == 0xfc00 {
                Some("private (unique local)")
            } else if v6.is_multicast() {
                Some("multicast")
            } else {
                None
            }
        }
    }
}
