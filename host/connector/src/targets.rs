//! Where the host's SSH and Docker connections may go. The address, port and user come from
//! the plugin's `connect-info`, so they are the plugin's word: a hostile or broken plugin
//! could point the host at any machine that then receives every job's script. The address is
//! resolved once, each resolved address is checked, and the connection goes to the checked
//! address (a name cannot resolve to one address for the check and another for the connect).
//!
//! - With `allowed_ranges` (CIDRs), an address must be in one of them.
//! - Without, any address is allowed except loopback, link-local (the clouds' metadata
//!   services live there) and IPv4-mapped forms of those.
//! - Unspecified, multicast and broadcast addresses are never allowed.

use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;

/// The pool's rule for plugin-chosen addresses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowedTargets {
    /// `allowed_ranges`; empty: the default rule.
    ranges: Vec<IpNet>,
}

impl AllowedTargets {
    /// Only addresses in `ranges`; an empty list is the default rule.
    pub fn ranges(ranges: Vec<IpNet>) -> Self {
        AllowedTargets { ranges }
    }

    /// Why `ip` may not be reached, or `None` when it may.
    pub fn refusal(&self, ip: IpAddr) -> Option<String> {
        let ip = ip.to_canonical();
        let never = match ip {
            IpAddr::V4(v4) => {
                if v4.is_unspecified() {
                    Some("unspecified")
                } else if v4.is_multicast() {
                    Some("multicast")
                } else if v4.is_broadcast() {
                    Some("broadcast")
                } else {
                    None
                }
            }
            IpAddr::V6(v6) => {
                if v6.is_unspecified() {
                    Some("unspecified")
                } else if v6.is_multicast() {
                    Some("multicast")
                } else {
                    None
                }
            }
        };
        if let Some(kind) = never {
            return Some(format!("{ip} is a {kind} address"));
        }
        if !self.ranges.is_empty() {
            return (!self.ranges.iter().any(|r| r.contains(&ip))).then(|| {
                let listed: Vec<String> = self.ranges.iter().map(ToString::to_string).collect();
                format!(
                    "{ip} is outside [pool.connector] allowed_ranges ({})",
                    listed.join(", ")
                )
            });
        }
        let special = match ip {
            IpAddr::V4(v4) if v4.is_loopback() => Some("loopback"),
            IpAddr::V4(v4) if v4.is_link_local() => Some("link-local"),
            IpAddr::V6(v6) if v6.is_loopback() => Some("loopback"),
            IpAddr::V6(v6) if v6.is_unicast_link_local() => Some("link-local"),
            _ => None,
        };
        special.map(|kind| {
            format!(
                "{ip} is a {kind} address, refused by default for a plugin-chosen target; list it in [pool.connector] allowed_ranges if the pool's machines really are there"
            )
        })
    }

    /// Resolves `host` (an address or a name) and checks every address it resolves to; the
    /// first is where to connect. A name with any refused address is refused whole.
    pub async fn resolve(&self, host: &str, port: u16) -> Result<SocketAddr, String> {
        let shown = format!("{host:?}");
        if let Ok(ip) = host.parse::<IpAddr>() {
            return match self.refusal(ip) {
                Some(why) => Err(format!("the plugin's address {shown}: {why}")),
                None => Ok(SocketAddr::new(ip, port)),
            };
        }
        if host.is_empty() || host.len() > 253 || host.chars().any(|c| c.is_control()) {
            return Err(format!("the plugin's address {shown} is not a host name"));
        }
        let found: Vec<SocketAddr> = tokio::net::lookup_host((host, port))
            .await
            .map_err(|e| format!("cannot resolve the plugin's address {shown}: {e}"))?
            .collect();
        for addr in &found {
            if let Some(why) = self.refusal(addr.ip()) {
                return Err(format!("the plugin's address {shown} resolves to {why}"));
            }
        }
        found
            .first()
            .copied()
            .ok_or_else(|| format!("the plugin's address {shown} resolves to no address"))
    }
}

/// Whether a login user the plugin chose (not the operator) is refused: `root` only with the
/// operator's word (`[pool.connector] username = "root"`).
pub fn refused_user(user: &str) -> Option<String> {
    (user == "root").then(|| {
        "the plugin chose the login user \"root\"; a plugin may not pick root by itself: set [pool.connector] username = \"root\" if the pool's machines really are reached as root".to_string()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("an address")
    }

    #[test]
    fn the_default_refuses_loopback_link_local_and_their_mapped_forms() {
        let rule = AllowedTargets::default();
        for refused in [
            "127.0.0.1",
            "127.9.9.9",
            "::1",
            "169.254.169.254",
            "fe80::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "0.0.0.0",
            "::",
            "224.0.0.1",
            "255.255.255.255",
            "ff02::1",
        ] {
            assert!(rule.refusal(ip(refused)).is_some(), "{refused} allowed");
        }
        for allowed in ["10.0.0.5", "192.0.2.10", "2001:db8::5", "172.16.0.1"] {
            assert_eq!(rule.refusal(ip(allowed)), None, "{allowed}");
        }
    }

    #[test]
    fn listed_ranges_allow_only_themselves_and_never_unspecified() {
        let rule = AllowedTargets::ranges(vec![
            "127.0.0.0/8".parse().expect("cidr"),
            "10.1.0.0/16".parse().expect("cidr"),
        ]);
        assert_eq!(rule.refusal(ip("127.0.0.1")), None);
        assert_eq!(rule.refusal(ip("::ffff:127.0.0.1")), None);
        assert_eq!(rule.refusal(ip("10.1.2.3")), None);
        let why = rule.refusal(ip("10.2.0.1")).expect("outside");
        assert!(
            why.contains("allowed_ranges (127.0.0.0/8, 10.1.0.0/16)"),
            "{why}"
        );
        let everything = AllowedTargets::ranges(vec!["0.0.0.0/0".parse().expect("cidr")]);
        assert!(everything.refusal(ip("0.0.0.0")).is_some());
    }

    #[tokio::test]
    async fn a_name_is_checked_by_what_it_resolves_to() {
        let rule = AllowedTargets::default();
        let why = rule.resolve("localhost", 22).await.expect_err("loopback");
        assert!(why.contains("\"localhost\" resolves to"), "{why}");
        let why = rule.resolve("a\nb", 22).await.expect_err("not a name");
        assert!(why.contains("\"a\\nb\" is not a host name"), "{why}");
        let open = AllowedTargets::ranges(vec!["127.0.0.0/8".parse().expect("cidr")]);
        assert_eq!(
            open.resolve("127.0.0.1", 2222).await,
            Ok("127.0.0.1:2222".parse().expect("addr"))
        );
    }

    #[test]
    fn only_root_is_refused_as_a_plugin_chosen_user() {
        assert!(refused_user("root").is_some());
        assert_eq!(refused_user("ubuntu"), None);
        assert_eq!(refused_user("rooty"), None);
    }
}
