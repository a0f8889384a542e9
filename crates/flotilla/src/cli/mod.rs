//! The command-line commands that live outside `main.rs`.

pub mod oci;
