//! Where a build script's cargo target directory is, for the two build scripts that build the
//! guest components into `<target>/wasm-guests` (host/builtin and tests/artifacts): both must
//! find the same directory, whether or not the build names a target, or each builds the guests
//! on its own. Included by both with `#[path]`.

use std::path::{Path, PathBuf};

/// The cargo target directory of this build: OUT_DIR is `<target>/<profile>/build/<pkg>/out`,
/// or `<target>/<triple>/<profile>/build/<pkg>/out` when a target was named (a cross build).
pub fn of(out: &Path) -> PathBuf {
    let above_profile = out.ancestors().nth(4).unwrap_or(out);
    let triple = std::env::var("TARGET").unwrap_or_default();
    match above_profile.parent() {
        Some(parent) if above_profile.file_name().is_some_and(|n| *n == *triple) => {
            parent.to_path_buf()
        }
        _ => above_profile.to_path_buf(),
    }
}
