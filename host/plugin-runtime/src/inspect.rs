//! Load-time checks: is this file a Flotilla provider component, and does it ask only for
//! what the `provider` world offers?

use std::path::Path;

use serde::Serialize;
use wasmtime::Engine;
use wasmtime::component::Component;

/// The contract this host implements.
pub const CONTRACT_PACKAGE: &str = "flotilla:provider";
/// Its version.
pub const CONTRACT_VERSION: &str = "0.1.4";
/// The world every plugin targets.
pub const WORLD: &str = "flotilla:provider/provider@0.1.4";
/// The one export every plugin must have.
pub const REQUIRED_EXPORT: &str = "flotilla:provider/instance-group";

/// Why a file is not a loadable plugin. Each message names the file and what to do.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The file could not be read.
    #[error("{path}: cannot read plugin: {source}")]
    Unreadable {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is empty.
    #[error("{path}: the file is empty; expected a WebAssembly component (.wasm)")]
    Empty {
        /// The file.
        path: String,
    },
    /// Not WebAssembly at all.
    #[error(
        "{path}: not a WebAssembly binary (no \\0asm header); expected a component built for wasm32-wasip2"
    )]
    NotWasm {
        /// The file.
        path: String,
    },
    /// A core module rather than a component.
    #[error(
        "{path}: this is a core WebAssembly module, not a component; build for wasm32-wasip2 or wrap it with `wasm-tools component new`"
    )]
    CoreModule {
        /// The file.
        path: String,
    },
    /// An unknown binary layer or version.
    #[error("{path}: unsupported WebAssembly binary version/layer {found:02x?}")]
    UnknownEncoding {
        /// The file.
        path: String,
        /// The four version/layer bytes.
        found: [u8; 4],
    },
    /// wasmtime rejected the component.
    #[error("{path}: invalid component: {message}")]
    Invalid {
        /// The file.
        path: String,
        /// wasmtime's message.
        message: String,
    },
    /// An import outside the world.
    #[error("{path}: imports `{import}`, which the {WORLD} world does not provide{hint}")]
    ForbiddenImport {
        /// The file.
        path: String,
        /// The offending import.
        import: String,
        /// Advice, starting with "; ".
        hint: String,
    },
    /// No `instance-group` export of a compatible version.
    #[error("{path}: does not export {REQUIRED_EXPORT}@{CONTRACT_VERSION}{found}")]
    MissingExport {
        /// The file.
        path: String,
        /// What it exports instead, starting with "; ".
        found: String,
    },
    /// The export exists but its functions do not match the contract.
    #[error("{path}: its {REQUIRED_EXPORT} does not match the {WORLD} contract: {message}")]
    ContractMismatch {
        /// The file.
        path: String,
        /// wasmtime's message.
        message: String,
    },
    /// The compile cache failed in a way that is not the plugin's fault.
    #[error("compile cache: {0}")]
    Cache(String),
}

/// Classifies the first eight bytes, so a core module or random file gets a precise error.
pub(crate) fn check_header(path: &str, bytes: &[u8]) -> Result<(), LoadError> {
    if bytes.is_empty() {
        return Err(LoadError::Empty {
            path: path.to_string(),
        });
    }
    let (Some(b"\0asm"), Some(version)) = (bytes.get(..4), bytes.get(4..8)) else {
        return Err(LoadError::NotWasm {
            path: path.to_string(),
        });
    };
    match version {
        [0x01, 0x00, 0x00, 0x00] => Err(LoadError::CoreModule {
            path: path.to_string(),
        }),
        [_, _, 0x01, 0x00] => Ok(()),
        _ => Err(LoadError::UnknownEncoding {
            path: path.to_string(),
            found: version.try_into().unwrap_or_default(),
        }),
    }
}

/// Reads a plugin file with an error that names it.
pub(crate) fn read_plugin(path: &Path) -> Result<Vec<u8>, LoadError> {
    let display = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|source| LoadError::Unreadable {
        path: display.clone(),
        source,
    })?;
    check_header(&display, &bytes)?;
    Ok(bytes)
}

/// Interfaces a plugin may import: the world's own, plus the WASI 0.2 runtime interfaces
/// that language toolchains import. The latter are linked with nothing granted.
const WASI_RUNTIME: &[(&str, &[&str])] = &[
    ("wasi:io", &["error", "poll", "streams"]),
    ("wasi:clocks", &["monotonic-clock", "wall-clock"]),
    ("wasi:random", &["random", "insecure", "insecure-seed"]),
    (
        "wasi:cli",
        &[
            "environment",
            "exit",
            "stdin",
            "stdout",
            "stderr",
            "terminal-input",
            "terminal-output",
            "terminal-stdin",
            "terminal-stdout",
            "terminal-stderr",
        ],
    ),
    ("wasi:filesystem", &["types", "preopens"]),
    (
        "wasi:sockets",
        &[
            "network",
            "instance-network",
            "tcp",
            "tcp-create-socket",
            "udp",
            "udp-create-socket",
            "ip-name-lookup",
        ],
    ),
];

/// How the host serves one import.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ImportKind {
    /// Part of the provider world (`log`, `types`).
    Contract,
    /// `wasi:http`: outbound requests through the pool's egress policy.
    Http,
    /// A WASI runtime interface, linked with nothing granted.
    WasiRuntime,
    /// `flotilla:test/probe`, linked only in the host's own tests (`test-probe` feature).
    TestProbe,
}

/// One import and how it is served.
#[derive(Debug, Clone, Serialize)]
pub struct ImportInfo {
    /// Full name, e.g. `wasi:http/outgoing-handler@0.2.12`.
    pub name: String,
    /// How it is served.
    pub kind: ImportKind,
}

struct Name<'a> {
    package: &'a str,
    interface: &'a str,
    version: Option<&'a str>,
}

fn split_name(name: &str) -> Option<Name<'_>> {
    let (path, version) = match name.split_once('@') {
        Some((p, v)) => (p, Some(v)),
        None => (name, None),
    };
    let (package, interface) = path.split_once('/')?;
    Some(Name {
        package,
        interface,
        version,
    })
}

/// Whether `version` is semver-compatible with the contract's 0.1.x.
fn contract_compatible(version: Option<&str>) -> bool {
    version.is_some_and(|v| v.starts_with("0.1.") && v[4..].chars().all(|c| c.is_ascii_digit()))
}

fn wasi_compatible(version: Option<&str>) -> bool {
    version.is_some_and(|v| v.starts_with("0.2."))
}

fn classify_import(name: &str) -> Result<ImportKind, String> {
    let Some(n) = split_name(name) else {
        return Err(
            "; plugins may import only interfaces of the provider world, not bare functions"
                .to_string(),
        );
    };
    if n.package == CONTRACT_PACKAGE {
        if !matches!(
            n.interface,
            "log" | "types" | "instance-access" | "group-limits" | "state"
        ) {
            return Err(format!(
                "; the contract has no importable interface `{}`",
                n.interface
            ));
        }
        if !contract_compatible(n.version) {
            return Err(format!(
                "; this host implements {CONTRACT_PACKAGE}@{CONTRACT_VERSION}; rebuild the plugin against that version"
            ));
        }
        return Ok(ImportKind::Contract);
    }
    if n.package == "wasi:http" {
        if matches!(n.interface, "types" | "outgoing-handler") && wasi_compatible(n.version) {
            return Ok(ImportKind::Http);
        }
        return Err(
            "; only wasi:http/outgoing-handler and wasi:http/types (0.2.x) are offered".to_string(),
        );
    }
    #[cfg(feature = "test-probe")]
    if name == crate::probe::INTERFACE {
        return Ok(ImportKind::TestProbe);
    }
    if let Some((_, interfaces)) = WASI_RUNTIME.iter().find(|(p, _)| *p == n.package) {
        if interfaces.contains(&n.interface) && wasi_compatible(n.version) {
            return Ok(ImportKind::WasiRuntime);
        }
        return Err(
            "; only WASI 0.2.x runtime interfaces are offered, with nothing granted".to_string(),
        );
    }
    Err(
        "; a plugin may reach the outside world only through wasi:http/outgoing-handler"
            .to_string(),
    )
}

/// What a component imports and exports, as `plugin check` prints it.
#[derive(Debug, Clone, Serialize)]
pub struct ComponentShape {
    /// The world it satisfies.
    pub world: String,
    /// Its imports, each classified.
    pub imports: Vec<ImportInfo>,
    /// Its exports, by name.
    pub exports: Vec<String>,
    /// The exact `instance-group` export name matched.
    pub instance_group: String,
}

/// Checks imports and exports against the world before anything is instantiated.
pub(crate) fn check_shape(
    path: &str,
    engine: &Engine,
    component: &Component,
) -> Result<ComponentShape, LoadError> {
    let ty = component.component_type();
    let mut imports = Vec::new();
    for (name, _) in ty.imports(engine) {
        match classify_import(name) {
            Ok(kind) => imports.push(ImportInfo {
                name: name.to_string(),
                kind,
            }),
            Err(hint) => {
                return Err(LoadError::ForbiddenImport {
                    path: path.to_string(),
                    import: name.to_string(),
                    hint,
                });
            }
        }
    }
    let exports: Vec<String> = ty.exports(engine).map(|(n, _)| n.to_string()).collect();
    let instance_group = exports.iter().find(|e| {
        split_name(e).is_some_and(|n| {
            n.package == CONTRACT_PACKAGE
                && n.interface == "instance-group"
                && contract_compatible(n.version)
        })
    });
    let Some(instance_group) = instance_group.cloned() else {
        let found = if exports.is_empty() {
            "; it exports nothing".to_string()
        } else {
            format!("; it exports: {}", exports.join(", "))
        };
        return Err(LoadError::MissingExport {
            path: path.to_string(),
            found,
        });
    };
    Ok(ComponentShape {
        world: WORLD.to_string(),
        imports,
        exports,
        instance_group,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_imports() {
        assert_eq!(
            classify_import("flotilla:provider/log@0.1.0"),
            Ok(ImportKind::Contract)
        );
        assert_eq!(
            classify_import("wasi:http/outgoing-handler@0.2.12"),
            Ok(ImportKind::Http)
        );
        assert_eq!(
            classify_import("wasi:cli/environment@0.2.6"),
            Ok(ImportKind::WasiRuntime)
        );
        assert!(classify_import("flotilla:provider/log@0.2.0").is_err());
        assert!(classify_import("wasi:http/incoming-handler@0.2.12").is_err());
        assert!(classify_import("wasi:keyvalue/store@0.2.0").is_err());
        assert!(classify_import("wasi:cli/environment@0.3.0").is_err());
        assert!(classify_import("evil").is_err());
    }

    #[test]
    fn headers() {
        assert!(matches!(
            check_header("f", b""),
            Err(LoadError::Empty { .. })
        ));
        assert!(matches!(
            check_header("f", b"hello world"),
            Err(LoadError::NotWasm { .. })
        ));
        assert!(matches!(
            check_header("f", b"\0asm\x01\0\0\0"),
            Err(LoadError::CoreModule { .. })
        ));
        assert!(check_header("f", b"\0asm\x0d\0\x01\0").is_ok());
    }
}
