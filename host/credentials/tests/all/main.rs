//! The credential kinds against loopback servers with their services' documented shapes: one
//! module per kind. They set the environment variables their credential chains read, so each
//! test holds the one environment lock for its whole run (`env::lock`).
#![allow(unsafe_code)] // set_var/remove_var, under env::lock
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)] // test code: a failed assumption is a failed test

mod azure;
mod gcp;

/// The process environment, which every test here changes.
mod env {
    use tokio::sync::{Mutex, MutexGuard};

    static ENV: Mutex<()> = Mutex::const_new(());

    /// Held by a test for its whole run: no other test's thread reads or writes the
    /// environment meanwhile (each test runs on a current-thread runtime, so its own reads
    /// happen on its thread). A test that panicked releases it as it unwinds.
    pub async fn lock() -> MutexGuard<'static, ()> {
        ENV.lock().await
    }

    pub fn set(var: &str, value: &str) {
        // SAFETY: the caller holds `lock()`, and no other thread of this process touches the
        // environment while it does.
        unsafe { std::env::set_var(var, value) };
    }

    pub fn unset(var: &str) {
        // SAFETY: as for `set`.
        unsafe { std::env::remove_var(var) };
    }
}
