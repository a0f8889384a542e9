//! A component's surface as the CNCF Wasm config records it: the names of its top-level imports
//! and exports (`wasi:io/streams@0.2.0`, `flotilla:provider/instance-group@0.1.3`), read from the
//! binary's sections. Nothing is compiled or run.
//!
//! The config format (`application/vnd.wasm.config.v0+json`) lists "the imports and exports of
//! the component", by the names its world gives them: for a component those are exactly the
//! names of its top-level import and export sections. Nested modules and components (a Python or
//! JavaScript plugin carries several) import and export among themselves and are not listed.

use wasmparser::{Encoding, Parser, Payload, Validator, WasmFeatures};

/// The top-level import and export names of a component, in the binary's order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Surface {
    pub imports: Vec<String>,
    pub exports: Vec<String>,
}

/// Validates `wasm` as a component and reads its surface. The error says why it is not one.
pub(crate) fn read(wasm: &[u8]) -> Result<Surface, String> {
    Validator::new_with_features(WasmFeatures::all())
        .validate_all(wasm)
        .map_err(|e| format!("it is not a valid WebAssembly component ({e})"))?;
    let mut surface = Surface {
        imports: Vec::new(),
        exports: Vec::new(),
    };
    // Every module or component, nested or not, opens with a version payload and closes with an
    // end payload; depth 1 is the outer component.
    let mut depth = 0usize;
    for payload in Parser::new(0).parse_all(wasm) {
        let payload = payload.map_err(|e| format!("it cannot be read ({e})"))?;
        match payload {
            Payload::Version { encoding, .. } => {
                depth += 1;
                if depth == 1 && encoding != Encoding::Component {
                    return Err("it is a core module, not a component".to_string());
                }
            }
            Payload::End(_) => depth = depth.saturating_sub(1),
            Payload::ComponentImportSection(reader) if depth == 1 => {
                for import in reader {
                    let import = import.map_err(|e| format!("its imports cannot be read ({e})"))?;
                    surface.imports.push(import.name.name.to_string());
                }
            }
            Payload::ComponentExportSection(reader) if depth == 1 => {
                for export in reader {
                    let export = export.map_err(|e| format!("its exports cannot be read ({e})"))?;
                    surface.exports.push(export.name.name.to_string());
                }
            }
            _ => {}
        }
    }
    Ok(surface)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A component with an import, a nested core module whose own import and export are not
    /// the component's, and an export.
    const NESTED: &str = r#"(component
        (import "wasi:cli/environment@0.2.0" (instance $env))
        (core module $m
            (import "inner" "f" (func))
            (func (export "g")))
        (component $c
            (import "nested-import" (func))
            (export "nested-export" (func 0)))
        (export "flotilla:provider/instance-group@0.1.3" (instance $env))
    )"#;

    #[test]
    fn only_the_outer_components_names_are_its_surface() {
        let wasm = wat::parse_str(NESTED).expect("the test component is valid text");
        let surface = read(&wasm).expect("a component");
        assert_eq!(surface.imports, ["wasi:cli/environment@0.2.0"]);
        assert_eq!(surface.exports, ["flotilla:provider/instance-group@0.1.3"]);
    }

    #[test]
    fn a_core_module_or_garbage_is_refused_with_the_reason() {
        let module = wat::parse_str("(module)").expect("valid text");
        let err = read(&module).expect_err("a module is not a component");
        assert!(err.contains("core module"), "{err}");
        let err = read(b"\0asm\x0d\0\x01\0garbage").expect_err("garbage");
        assert!(err.contains("not a valid WebAssembly component"), "{err}");
    }
}
