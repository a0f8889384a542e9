//! A plugin's durable state: a small key-value map the host keeps for each pool and offers to
//! its plugin through the contract's `state` interface (since 0.1.3), so a plugin whose only
//! record of its machines is its own (the static plugin's activation) keeps it across a trap,
//! a restart or an upgrade of the host.
//!
//! Owns: the trait the host's stores implement, the limits every store is held to, and an
//! in-memory store for hosts without a state directory. Must not know: files, databases,
//! WebAssembly.

use parking_lot::Mutex;
use std::collections::BTreeMap;

/// Why a state operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StateError {
    /// The write would pass one of the pool's limits; nothing was written.
    #[error("{0}")]
    TooLarge(String),
    /// The store could not be read or written; nothing was changed.
    #[error("the plugin's state is unavailable: {0}")]
    Unavailable(String),
}

/// The limits of one pool's state, checked before any write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateLimits {
    /// Bytes of one key.
    pub key_bytes: usize,
    /// Bytes of one value.
    pub value_bytes: usize,
    /// Keys in all.
    pub keys: usize,
    /// Bytes of every key and value together.
    pub total_bytes: usize,
    /// Writes (`set`, `delete`) in one export call: each is a durable commit to the file the
    /// lease journal shares, so a plugin that writes in a loop must not hold it.
    pub writes_per_call: u32,
    /// Bytes (key and value) a pool's plugin may write per minute, with a burst of as much:
    /// the state's whole size may be rewritten once a minute, never in a loop that keeps the
    /// file every pool's leases are committed to busy.
    pub write_bytes_per_minute: usize,
}

impl Default for StateLimits {
    fn default() -> Self {
        StateLimits {
            key_bytes: 256,
            value_bytes: 64 << 10,
            keys: 1024,
            total_bytes: 1 << 20,
            writes_per_call: 64,
            write_bytes_per_minute: 1 << 20,
        }
    }
}

impl StateLimits {
    /// Whether writing `key` = `value` into `current` keeps within the limits.
    pub fn check(
        &self,
        current: &BTreeMap<String, Vec<u8>>,
        key: &str,
        value: &[u8],
    ) -> Result<(), StateError> {
        if key.is_empty() || key.len() > self.key_bytes || key.chars().any(char::is_control) {
            return Err(StateError::TooLarge(format!(
                "a key must be 1 to {} bytes without control characters",
                self.key_bytes
            )));
        }
        if value.len() > self.value_bytes {
            return Err(StateError::TooLarge(format!(
                "a value may hold at most {} bytes (this one has {})",
                self.value_bytes,
                value.len()
            )));
        }
        let replaced = current.get(key);
        let keys = current.len() + usize::from(replaced.is_none());
        if keys > self.keys {
            return Err(StateError::TooLarge(format!(
                "the pool's state may hold at most {} keys",
                self.keys
            )));
        }
        let total: usize = current
            .iter()
            .filter(|(k, _)| k.as_str() != key)
            .map(|(k, v)| k.len() + v.len())
            .sum::<usize>()
            + key.len()
            + value.len();
        if total > self.total_bytes {
            return Err(StateError::TooLarge(format!(
                "the pool's state may hold at most {} bytes in all",
                self.total_bytes
            )));
        }
        Ok(())
    }
}

/// One pool's state. Every write is durable when it returns (for stores that outlive the
/// process) and is refused whole when it would pass the limits.
pub trait PluginState: Send + Sync + std::fmt::Debug {
    /// The value of `key`, if any.
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StateError>;
    /// Writes `key` = `value`.
    fn set(&self, key: &str, value: &[u8]) -> Result<(), StateError>;
    /// Removes `key` (absent is fine).
    fn delete(&self, key: &str) -> Result<(), StateError>;
    /// Every key, sorted.
    fn keys(&self) -> Result<Vec<String>, StateError>;
}

/// State in memory: it survives the plugin's traps, not the process.
#[derive(Debug, Default)]
pub struct MemoryState {
    map: Mutex<BTreeMap<String, Vec<u8>>>,
    limits: StateLimits,
}

impl MemoryState {
    fn map(&self) -> parking_lot::MutexGuard<'_, BTreeMap<String, Vec<u8>>> {
        // Every write is one insert or remove.
        self.map.lock()
    }
}

impl PluginState for MemoryState {
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StateError> {
        Ok(self.map().get(key).cloned())
    }

    fn set(&self, key: &str, value: &[u8]) -> Result<(), StateError> {
        let mut map = self.map();
        self.limits.check(&map, key, value)?;
        map.insert(key.to_string(), value.to_vec());
        Ok(())
    }

    fn delete(&self, key: &str) -> Result<(), StateError> {
        self.map().remove(key);
        Ok(())
    }

    fn keys(&self) -> Result<Vec<String>, StateError> {
        Ok(self.map().keys().cloned().collect())
    }
}

/// A pool's state with a write budget ([`StateLimits::write_bytes_per_minute`]): a token
/// bucket of bytes, full at start, refilled continuously. A write past it is refused whole,
/// before it reaches the store, and the plugin is told to try later.
#[derive(Debug)]
pub struct Budgeted {
    inner: std::sync::Arc<dyn PluginState>,
    per_minute: usize,
    /// Bytes that may be written now, and when that was computed.
    bucket: Mutex<(f64, std::time::Instant)>,
}

impl Budgeted {
    /// `inner`, writing at most `per_minute` bytes a minute.
    pub fn new(inner: std::sync::Arc<dyn PluginState>, per_minute: usize) -> Budgeted {
        Budgeted {
            inner,
            per_minute,
            bucket: Mutex::new((per_minute as f64, std::time::Instant::now())),
        }
    }

    /// Takes `bytes` from the bucket, or says why not.
    fn take(&self, bytes: usize) -> Result<(), StateError> {
        let mut bucket = self.bucket.lock();
        let now = std::time::Instant::now();
        let rate = self.per_minute as f64 / 60.0;
        let refilled = (bucket.0 + now.duration_since(bucket.1).as_secs_f64() * rate)
            .min(self.per_minute as f64);
        *bucket = (refilled, now);
        if (bytes as f64) > refilled {
            return Err(StateError::TooLarge(format!(
                "the pool's state takes at most {} bytes of writes a minute; this write of {bytes} bytes is over that budget, try again later",
                self.per_minute
            )));
        }
        bucket.0 = refilled - bytes as f64;
        Ok(())
    }
}

impl PluginState for Budgeted {
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StateError> {
        self.inner.get(key)
    }

    fn set(&self, key: &str, value: &[u8]) -> Result<(), StateError> {
        self.take(key.len() + value.len())?;
        self.inner.set(key, value)
    }

    fn delete(&self, key: &str) -> Result<(), StateError> {
        self.take(key.len())?;
        self.inner.delete(key)
    }

    fn keys(&self) -> Result<Vec<String>, StateError> {
        self.inner.keys()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_past_the_byte_budget_are_refused_until_it_refills() {
        let state = Budgeted::new(std::sync::Arc::new(MemoryState::default()), 60_000);
        // The burst: 60,000 bytes at once.
        for i in 0..6 {
            state
                .set(&format!("k{i}"), &[0; 9_998])
                .expect("within the burst");
        }
        let refused = state.set("k6", &[0; 9_998]).expect_err("over budget");
        assert!(
            matches!(refused, StateError::TooLarge(m) if m.contains("60000 bytes of writes a minute"))
        );
        assert_eq!(state.get("k6").expect("read"), None, "refused whole");
        // 1,000 bytes a second come back.
        std::thread::sleep(std::time::Duration::from_millis(1_100));
        state.set("k6", &[0; 998]).expect("refilled");
    }

    #[test]
    fn writes_past_the_limits_are_refused_whole() {
        let state = MemoryState::default();
        state.set("a", b"1").expect("small");
        assert!(matches!(
            state.set("big", &vec![0; 65 << 10]),
            Err(StateError::TooLarge(_))
        ));
        assert!(matches!(state.set("", b"x"), Err(StateError::TooLarge(_))));
        assert!(matches!(
            state.set(&"k".repeat(300), b"x"),
            Err(StateError::TooLarge(_))
        ));
        for i in 0..15 {
            state
                .set(&format!("v{i}"), &vec![1; 64 << 10])
                .expect("under 1 MiB");
        }
        let over = state.set("v15", &vec![1; 64 << 10]);
        assert!(matches!(over, Err(StateError::TooLarge(_))), "{over:?}");
        // Replacing a value counts it once.
        state.set("v0", &vec![2; 64 << 10]).expect("a replacement");
        assert_eq!(state.get("a").expect("get"), Some(b"1".to_vec()));
        assert_eq!(state.keys().expect("keys").len(), 16);
    }
}
