//! Address classes: which resolved addresses a plugin may not reach unless its pool lists the
//! range. This module classifies; the egress hook decides and reports.
//!
//! IPv6 is deny-by-default outside global unicast (`2000::/3`), and every IPv6 form that embeds
//! or maps an IPv4 address (mapped, compatible, SIIT, NAT64, 6to4) is classified as the IPv4
//! address it carries, so `64:ff9b::a9fe:a9fe` is the metadata service, not a global address.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Why an address is refused unless the pool allows its range explicitly.
pub fn blocked_reason(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => blocked_v4(v4),
        IpAddr::V6(v6) => match embedded_v4(v6) {
            Embedded::V4(v4) => blocked_v4(v4),
            Embedded::Opaque(why) => Some(why),
            Embedded::None => blocked_v6(v6),
        },
    }
}

fn blocked_v4(v4: Ipv4Addr) -> Option<&'static str> {
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
    } else if o[0] >= 240 {
        Some("reserved")
    } else {
        None
    }
}

/// What an IPv6 address carries.
enum Embedded {
    /// An IPv4 address, to classify as such.
    V4(Ipv4Addr),
    /// A translation or tunnel prefix whose IPv4 part cannot be located: refused.
    Opaque(&'static str),
    /// A plain IPv6 address.
    None,
}

fn v4_of(hi: u16, lo: u16) -> Ipv4Addr {
    let [a, b] = hi.to_be_bytes();
    let [c, d] = lo.to_be_bytes();
    Ipv4Addr::new(a, b, c, d)
}

fn embedded_v4(v6: Ipv6Addr) -> Embedded {
    let s = v6.segments();
    match s {
        // ::ffff:a.b.c.d (IPv4-mapped)
        [0, 0, 0, 0, 0, 0xffff, hi, lo] => Embedded::V4(v4_of(hi, lo)),
        // ::ffff:0:a.b.c.d (SIIT, RFC 6052/7915)
        [0, 0, 0, 0, 0xffff, 0, hi, lo] => Embedded::V4(v4_of(hi, lo)),
        // ::a.b.c.d (IPv4-compatible, deprecated); :: and ::1 are themselves below.
        [0, 0, 0, 0, 0, 0, hi, lo] if (hi, lo) != (0, 0) && (hi, lo) != (0, 1) => {
            Embedded::V4(v4_of(hi, lo))
        }
        // 64:ff9b::/96 (the NAT64 well-known prefix)
        [0x64, 0xff9b, 0, 0, 0, 0, hi, lo] => Embedded::V4(v4_of(hi, lo)),
        // 64:ff9b:1::/48 (local-use NAT64): the IPv4 part's place depends on the operator's
        // prefix length, so it cannot be classified.
        [0x64, 0xff9b, 1, ..] => Embedded::Opaque("NAT64 (local-use prefix)"),
        [0x64, 0xff9b, ..] => Embedded::Opaque("NAT64"),
        // 2002::/16 (6to4): the IPv4 address follows the prefix.
        [0x2002, hi, lo, ..] => Embedded::V4(v4_of(hi, lo)),
        // 2001::/32 (Teredo): carries an obfuscated IPv4 address.
        [0x2001, 0, ..] => Embedded::Opaque("Teredo tunnel"),
        _ => Embedded::None,
    }
}

fn blocked_v6(v6: Ipv6Addr) -> Option<&'static str> {
    let s = v6.segments();
    let first = s[0];
    if v6.is_unspecified() {
        Some("unspecified")
    } else if v6.is_loopback() {
        Some("loopback")
    } else if (first & 0xffc0) == 0xfe80 {
        Some("link-local")
    } else if (first & 0xffc0) == 0xfec0 {
        Some("site-local (deprecated)")
    } else if (first & 0xfe00) == 0xfc00 {
        Some("private (unique local)")
    } else if v6.is_multicast() {
        Some("multicast")
    } else if first == 0x2001 && s[1] == 0x0db8 {
        Some("documentation")
    } else if (first & 0xe000) != 0x2000 {
        Some("not global unicast")
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reason(text: &str) -> Option<&'static str> {
        blocked_reason(text.parse().expect("an address"))
    }

    #[test]
    fn every_ipv6_form_that_carries_ipv4_is_classified_as_that_ipv4() {
        for (addr, want) in [
            (
                "::ffff:169.254.169.254",
                "link-local (includes the cloud metadata service)",
            ),
            (
                "::169.254.169.254",
                "link-local (includes the cloud metadata service)",
            ),
            ("::ffff:0:10.0.0.1", "private"),
            (
                "64:ff9b::a9fe:a9fe",
                "link-local (includes the cloud metadata service)",
            ),
            ("64:ff9b::127.0.0.1", "loopback"),
            ("2002:0a00:0001::1", "private"),
            ("2002:7f00:1::", "loopback"),
        ] {
            assert_eq!(reason(addr), Some(want), "{addr}");
        }
        // A global IPv4 address behind NAT64 or 6to4 is as reachable as itself.
        assert_eq!(reason("64:ff9b::8.8.8.8"), None);
        assert_eq!(reason("2002:0808:0808::1"), None);
    }

    #[test]
    fn ipv6_outside_global_unicast_is_refused() {
        for (addr, want) in [
            ("64:ff9b:1::a9fe:a9fe", "NAT64 (local-use prefix)"),
            ("fec0::1", "site-local (deprecated)"),
            ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "Teredo tunnel"),
            ("2001:db8::1", "documentation"),
            ("100::1", "not global unicast"),
            ("4000::1", "not global unicast"),
            ("::1", "loopback"),
            ("::", "unspecified"),
            ("fe80::1", "link-local"),
            ("fd00::1", "private (unique local)"),
        ] {
            assert_eq!(reason(addr), Some(want), "{addr}");
        }
        assert_eq!(reason("2606:4700::1111"), None, "global unicast");
    }

    #[test]
    fn ipv4_classes() {
        assert_eq!(reason("240.0.0.1"), Some("reserved"));
        assert_eq!(reason("100.64.0.1"), Some("shared address space (CGNAT)"));
        assert_eq!(reason("1.1.1.1"), None);
    }
}
