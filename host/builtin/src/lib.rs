//! The official plugins, embedded: `plugin = "builtin:aws"` (and `gcp`, `azure`, `static`)
//! loads one of these instead of a file or an OCI artifact. They are components like any other:
//! the host checks, sandboxes and limits them the same way; only where the bytes come from
//! differs. `build.rs` builds them from `plugins/` with the workspace's `guest` profile.
//!
//! Owns: the list of built-in plugins and their bytes.
//! Must not know: wasmtime, configs, pools.

/// One embedded plugin.
#[derive(Debug, Clone, Copy)]
pub struct Builtin {
    /// The name after `builtin:`.
    pub name: &'static str,
    /// The workspace package it was built from.
    pub package: &'static str,
    /// The component.
    pub bytes: &'static [u8],
}

/// The prefix of a built-in plugin's reference in a config.
pub const PREFIX: &str = "builtin:";

/// Every built-in plugin, sorted by name.
pub static ALL: &[Builtin] = include!(concat!(env!("OUT_DIR"), "/builtin.rs"));

/// The built-in plugin `name` (without the prefix).
pub fn find(name: &str) -> Option<&'static Builtin> {
    ALL.iter().find(|b| b.name == name)
}

/// The names, for messages: `aws, azure, gcp, static`.
pub fn names() -> String {
    ALL.iter().map(|b| b.name).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_builtin_is_a_component() {
        assert_eq!(names(), "aws, azure, gcp, static");
        for b in ALL {
            // A component's preamble: \0asm, then version 0x0d and layer 1 (a core module has
            // layer 0), so a core module or a stale empty file cannot slip in.
            assert_eq!(&b.bytes[..4], b"\0asm", "{}", b.name);
            assert_eq!(&b.bytes[4..8], &[0x0d, 0x00, 0x01, 0x00], "{}", b.name);
            assert!(
                b.bytes.len() > 50_000,
                "{}: {} bytes",
                b.name,
                b.bytes.len()
            );
        }
        assert!(find("aws").is_some());
        assert!(find("docker-machine").is_none());
    }
}
