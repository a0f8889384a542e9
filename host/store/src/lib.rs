//! The host's durable state: each pool's leases, its instances' use counts and its plugin's
//! `state` map, in one redb file under the state directory (`<state_dir>/leases.redb`).
//!
//! The file carries its schema version (table `meta`, key `schema`): a file of the previous
//! release (no version: schema 1) opens and is marked as this one's; a file written by a newer
//! release is refused with a message that says so, never misread.
//!
//! Owns: the file, its tables and the encoding; every write is committed with fsync before it
//! returns, so a lease the API acknowledged survives `kill -9` and power loss (redb is
//! copy-on-write with checksummed commits: a torn write leaves the last commit intact).
//! Must not know: scaling, HTTP or plugins. It implements the scaler's [`LeaseJournal`].
//!
//! Why redb: pure Rust (no C toolchain for SQLite, which matters for the Windows and musl
//! builds), crash-safe by default, ACID, stable file format, actively maintained; the data is
//! a few small key-value tables, so SQL would buy nothing.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

mod history;
mod record;

pub use history::HistoryLog;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};

use flotilla_provider::{PluginState, StateError, StateLimits};
use flotilla_scaler::driver::LeaseJournal;
use flotilla_scaler::{JournalError, Lease};

/// (pool, lease id) → the lease as JSON.
const LEASES: TableDefinition<(&str, u64), &[u8]> = TableDefinition::new("leases");
/// (pool, instance id) → jobs the instance has taken.
const USES: TableDefinition<(&str, &str), u32> = TableDefinition::new("instance_uses");
/// The tenant each instance is bound to (a table older releases ignore).
const TENANTS: TableDefinition<(&str, &str), &str> = TableDefinition::new("instance_tenants");
/// (pool, key) → a value of the pool's plugin `state` (schema 2).
const PLUGIN_STATE: TableDefinition<(&str, &str), &[u8]> = TableDefinition::new("plugin_state");
/// `schema` → the file's schema version.
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");

/// The schema this release writes: 1 had leases and uses; 2 adds the plugins' state and the
/// version itself.
pub const SCHEMA: u64 = 2;

/// Why the store failed.
#[derive(Debug, thiserror::Error)]
#[error("lease store {path}: {why}")]
pub struct StoreError {
    path: String,
    why: String,
}

/// The open store, shared by every pool.
#[derive(Debug)]
pub struct Store {
    db: Database,
    path: PathBuf,
    /// One line per finished lease, beside the journal.
    history: HistoryLog,
}

/// What a pool had when the process stopped.
#[derive(Debug, Default)]
pub struct Restored {
    /// Its leases.
    pub leases: Vec<Lease>,
    /// Its instances' use counts.
    pub uses: HashMap<String, u32>,
    /// The tenant each instance is bound to.
    pub tenants: HashMap<String, String>,
}

impl Store {
    /// Opens (or creates) the store file; a damaged file is an error that names it.
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        let fail = |why: String| StoreError {
            path: path.display().to_string(),
            why,
        };
        let db = Database::create(path).map_err(|e| fail(e.to_string()))?;
        let found = {
            let txn = db.begin_read().map_err(|e| fail(e.to_string()))?;
            match txn.open_table(META) {
                Ok(meta) => meta
                    .get("schema")
                    .map_err(|e| fail(e.to_string()))?
                    .map(|v| v.value()),
                // No meta table: a new file, or one of schema 1.
                Err(redb::TableError::TableDoesNotExist(_)) => None,
                Err(e) => return Err(fail(e.to_string())),
            }
        };
        if let Some(version) = found.filter(|v| *v > SCHEMA) {
            return Err(fail(format!(
                "written by a newer flotilla (journal schema {version}; this one reads schemas 1 to {SCHEMA}); run that release, or move the file away to start with no leases"
            )));
        }
        // Create the tables, so reads of a new store see them empty, and mark the schema.
        let txn = db.begin_write().map_err(|e| fail(e.to_string()))?;
        txn.open_table(LEASES).map_err(|e| fail(e.to_string()))?;
        txn.open_table(USES).map_err(|e| fail(e.to_string()))?;
        txn.open_table(TENANTS).map_err(|e| fail(e.to_string()))?;
        txn.open_table(PLUGIN_STATE)
            .map_err(|e| fail(e.to_string()))?;
        if found != Some(SCHEMA) {
            let mut meta = txn.open_table(META).map_err(|e| fail(e.to_string()))?;
            meta.insert("schema", SCHEMA)
                .map_err(|e| fail(e.to_string()))?;
            drop(meta);
            tracing::info!(path = %path.display(), from = found.unwrap_or(1), to = SCHEMA, "lease journal schema set");
        }
        txn.commit().map_err(|e| fail(e.to_string()))?;
        Ok(Store {
            db,
            path: path.to_path_buf(),
            history: HistoryLog::beside(path),
        })
    }

    fn error(&self, why: impl std::fmt::Display) -> StoreError {
        StoreError {
            path: self.path.display().to_string(),
            why: why.to_string(),
        }
    }

    /// Everything stored for `pool`. A lease record that does not decode is skipped and
    /// logged, never fatal.
    pub fn load(&self, pool: &str) -> Result<Restored, StoreError> {
        let txn = self.db.begin_read().map_err(|e| self.error(e))?;
        let leases = txn.open_table(LEASES).map_err(|e| self.error(e))?;
        let mut out = Restored::default();
        for row in leases
            .range((pool, 0)..=(pool, u64::MAX))
            .map_err(|e| self.error(e))?
        {
            let (key, value) = row.map_err(|e| self.error(e))?;
            match serde_json::from_slice::<record::LeaseRecord>(value.value()) {
                Ok(record) => out.leases.push(record.into()),
                Err(e) => tracing::error!(
                    pool,
                    lease = key.value().1,
                    "unreadable lease record skipped: {e}"
                ),
            }
        }
        let uses = txn.open_table(USES).map_err(|e| self.error(e))?;
        for row in uses.range((pool, "")..).map_err(|e| self.error(e))? {
            let (key, value) = row.map_err(|e| self.error(e))?;
            let (p, instance) = key.value();
            if p != pool {
                break;
            }
            out.uses.insert(instance.to_string(), value.value());
        }
        let tenants = txn.open_table(TENANTS).map_err(|e| self.error(e))?;
        for row in tenants.range((pool, "")..).map_err(|e| self.error(e))? {
            let (key, value) = row.map_err(|e| self.error(e))?;
            let (p, instance) = key.value();
            if p != pool {
                break;
            }
            out.tenants
                .insert(instance.to_string(), value.value().to_string());
        }
        Ok(out)
    }

    /// The largest lease id stored for any pool (0 when none).
    pub fn max_lease_id(&self) -> Result<u64, StoreError> {
        let txn = self.db.begin_read().map_err(|e| self.error(e))?;
        let leases = txn.open_table(LEASES).map_err(|e| self.error(e))?;
        let mut max = 0;
        for row in leases.iter().map_err(|e| self.error(e))? {
            let (key, _) = row.map_err(|e| self.error(e))?;
            max = max.max(key.value().1);
        }
        Ok(max)
    }

    /// One write transaction, committed durably.
    fn write(
        &self,
        f: impl FnOnce(&redb::WriteTransaction) -> Result<(), redb::Error>,
    ) -> Result<(), StoreError> {
        let txn = self.db.begin_write().map_err(|e| self.error(e))?;
        f(&txn).map_err(|e| self.error(e))?;
        txn.commit().map_err(|e| self.error(e))
    }

    /// A pool's journal.
    pub fn journal(self: &Arc<Self>, pool: &str) -> PoolJournal {
        PoolJournal {
            store: self.clone(),
            pool: pool.to_string(),
        }
    }
}

impl Store {
    /// A pool's plugin `state`, kept in this file, with the contract's limits.
    pub fn plugin_state(self: &Arc<Self>, pool: &str) -> Result<PoolState, StoreError> {
        let txn = self.db.begin_read().map_err(|e| self.error(e))?;
        let table = txn.open_table(PLUGIN_STATE).map_err(|e| self.error(e))?;
        let mut map = BTreeMap::new();
        for row in table.range((pool, "")..).map_err(|e| self.error(e))? {
            let (key, value) = row.map_err(|e| self.error(e))?;
            let (p, k) = key.value();
            if p != pool {
                break;
            }
            map.insert(k.to_string(), value.value().to_vec());
        }
        Ok(PoolState {
            store: self.clone(),
            pool: pool.to_string(),
            map: parking_lot::Mutex::new(map),
            limits: StateLimits::default(),
        })
    }
}

/// One pool's plugin `state`: read once at start, then every write goes to the file (durably)
/// before it is applied to the copy in memory that answers reads.
#[derive(Debug)]
pub struct PoolState {
    store: Arc<Store>,
    pool: String,
    map: parking_lot::Mutex<BTreeMap<String, Vec<u8>>>,
    limits: StateLimits,
}

impl PluginState for PoolState {
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StateError> {
        Ok(self.map.lock().get(key).cloned())
    }

    fn set(&self, key: &str, value: &[u8]) -> Result<(), StateError> {
        let mut map = self.map.lock();
        self.limits.check(&map, key, value)?;
        let pool = self.pool.as_str();
        self.store
            .write(|txn| {
                txn.open_table(PLUGIN_STATE)?.insert((pool, key), value)?;
                Ok(())
            })
            .map_err(|e| StateError::Unavailable(e.to_string()))?;
        map.insert(key.to_string(), value.to_vec());
        Ok(())
    }

    fn delete(&self, key: &str) -> Result<(), StateError> {
        let mut map = self.map.lock();
        let pool = self.pool.as_str();
        self.store
            .write(|txn| {
                txn.open_table(PLUGIN_STATE)?.remove((pool, key))?;
                Ok(())
            })
            .map_err(|e| StateError::Unavailable(e.to_string()))?;
        map.remove(key);
        Ok(())
    }

    fn keys(&self) -> Result<Vec<String>, StateError> {
        Ok(self.map.lock().keys().cloned().collect())
    }
}

/// One pool's view of the store, as the scaler writes it.
#[derive(Debug, Clone)]
pub struct PoolJournal {
    store: Arc<Store>,
    pool: String,
}

impl LeaseJournal for PoolJournal {
    fn save(&self, lease: &Lease, uses: Option<(&str, u32)>) -> Result<(), JournalError> {
        let bytes =
            serde_json::to_vec(&record::LeaseRecord::from(lease)).map_err(JournalError::new)?;
        let pool = self.pool.as_str();
        self.store
            .write(|txn| {
                txn.open_table(LEASES)?
                    .insert((pool, lease.id), bytes.as_slice())?;
                if let Some((instance, n)) = uses {
                    txn.open_table(USES)?.insert((pool, instance), n)?;
                    // Written with the lease that binds it, so a binding is never lost to
                    // a restart once its job has the machine.
                    if let Some(tenant) = &lease.tenant {
                        txn.open_table(TENANTS)?
                            .insert((pool, instance), tenant.as_str())?;
                    }
                }
                Ok(())
            })
            .map_err(JournalError::new)
    }

    fn remove(&self, id: u64) -> Result<(), JournalError> {
        let pool = self.pool.as_str();
        self.store
            .write(|txn| {
                txn.open_table(LEASES)?.remove((pool, id))?;
                Ok(())
            })
            .map_err(JournalError::new)
    }

    fn finished(&self, lease: &Lease, released_at: flotilla_scaler::Millis) {
        self.store.history.append(&self.pool, lease, released_at);
    }

    fn forget_instance(&self, instance: &str) -> Result<(), JournalError> {
        let pool = self.pool.as_str();
        self.store
            .write(|txn| {
                txn.open_table(USES)?.remove((pool, instance))?;
                txn.open_table(TENANTS)?.remove((pool, instance))?;
                Ok(())
            })
            .map_err(JournalError::new)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use flotilla_scaler::LeaseState;

    fn lease(id: u64) -> Lease {
        Lease {
            id,
            state: LeaseState::Acquired {
                instance: "i-1".into(),
                slot: 0,
            },
            reserved_at: 1,
            acquired_at: Some(2),
            labels: BTreeMap::from([("gitlab-job".into(), "7".into())]),
            expires_at: None,
            deadline_at: None,
            tenant: None,
            handed_from: None,
        }
    }

    /// An instance's tenant is written with the lease that bound it and survives a reopen;
    /// forgetting the instance forgets it.
    #[test]
    fn a_tenant_binding_survives_a_reopen_until_its_instance_is_forgotten() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("leases.redb");
        let bound = Lease {
            tenant: Some("project-4-protected".into()),
            ..lease(5)
        };
        {
            let store = Arc::new(Store::open(&path).expect("open"));
            store
                .journal("a")
                .save(&bound, Some(("i-1", 1)))
                .expect("save");
            store.journal("a").remove(5).expect("released");
        }
        let store = Arc::new(Store::open(&path).expect("reopen"));
        let a = store.load("a").expect("load");
        assert!(a.leases.is_empty());
        assert_eq!(
            a.tenants,
            HashMap::from([("i-1".to_string(), "project-4-protected".to_string())])
        );
        assert!(store.load("b").expect("load").tenants.is_empty());
        store.journal("a").forget_instance("i-1").expect("forget");
        assert!(store.load("a").expect("load").tenants.is_empty());
    }

    #[test]
    fn leases_and_uses_survive_a_reopen_per_pool() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("leases.redb");
        {
            let store = Arc::new(Store::open(&path).expect("open"));
            let a = store.journal("a");
            a.save(&lease(5), Some(("i-1", 3))).expect("save");
            a.save(&lease(6), None).expect("save");
            a.remove(6).expect("remove");
            store.journal("b").save(&lease(9), None).expect("save");
        }
        let store = Store::open(&path).expect("reopen");
        let a = store.load("a").expect("load");
        assert_eq!(a.leases, vec![lease(5)]);
        assert_eq!(a.uses, HashMap::from([("i-1".to_string(), 3)]));
        assert_eq!(store.load("b").expect("load").leases.len(), 1);
        assert_eq!(store.max_lease_id().expect("max"), 9);
    }

    #[test]
    fn plugin_state_survives_a_reopen_per_pool_and_respects_the_limits() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("leases.redb");
        {
            let store = Arc::new(Store::open(&path).expect("open"));
            let a = store.plugin_state("a").expect("state");
            a.set("active", b"[\"m1\"]").expect("set");
            a.set("gone", b"x").expect("set");
            a.delete("gone").expect("delete");
            assert!(a.set("big", &vec![0; 1 << 20]).is_err());
            store
                .plugin_state("b")
                .expect("state")
                .set("active", b"[]")
                .expect("set");
        }
        let store = Arc::new(Store::open(&path).expect("reopen"));
        let a = store.plugin_state("a").expect("state");
        assert_eq!(a.keys().expect("keys"), ["active"]);
        assert_eq!(a.get("active").expect("get"), Some(b"[\"m1\"]".to_vec()));
        assert_eq!(
            store
                .plugin_state("b")
                .expect("b")
                .get("active")
                .expect("get"),
            Some(b"[]".to_vec())
        );
    }

    /// `tests/data/journal-v1.redb` was written by the previous release (schema 1, before the
    /// version was recorded): two leases of pool `static` and a failed one, and m1's uses.
    #[test]
    fn a_journal_of_the_previous_release_opens_and_keeps_its_leases() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("leases.redb");
        std::fs::copy(
            concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/journal-v1.redb"),
            &path,
        )
        .expect("fixture");
        let store = Store::open(&path).expect("a schema-1 journal opens");
        let restored = store.load("static").expect("load");
        let mut ids: Vec<u64> = restored.leases.iter().map(|l| l.id).collect();
        ids.sort();
        assert_eq!(
            ids,
            [
                1_839_193_179_246_723,
                1_839_193_179_246_724,
                1_839_193_179_246_725
            ]
        );
        assert!(restored.leases.iter().any(
            |l| matches!(&l.state, LeaseState::Acquired { instance, .. } if instance == "m1")
        ));
        assert_eq!(restored.uses.get("m1"), Some(&3));
        drop(store);
        // Marked as this release's now.
        let db = Database::create(&path).expect("db");
        let txn = db.begin_read().expect("read");
        let meta = txn.open_table(META).expect("meta");
        assert_eq!(
            meta.get("schema").expect("get").map(|v| v.value()),
            Some(SCHEMA)
        );
    }

    #[test]
    fn a_journal_of_a_newer_release_is_refused_not_misread() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("leases.redb");
        {
            let db = Database::create(&path).expect("db");
            let txn = db.begin_write().expect("write");
            txn.open_table(META)
                .expect("meta")
                .insert("schema", SCHEMA + 1)
                .expect("insert");
            txn.commit().expect("commit");
        }
        let err = Store::open(&path).expect_err("refused");
        let text = err.to_string();
        assert!(
            text.contains("newer flotilla") && text.contains("leases.redb"),
            "{text}"
        );
    }

    #[test]
    fn a_damaged_file_is_an_error_that_names_it() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("leases.redb");
        std::fs::write(&path, vec![0x5a; 8192]).expect("garbage");
        let err = Store::open(&path).expect_err("not a store");
        assert!(err.to_string().contains("leases.redb"), "{err}");
    }
}
