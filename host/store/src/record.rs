//! The journal's own record of a lease: what a lease's row holds is this type, not the
//! scaler's `Lease`, so a change to the scaler's lease (or to the API's, which has its own
//! type) cannot change what a journal holds or how an older journal reads. Its JSON is schema
//! 2's, which schema 1 wrote too; a field added here is optional, and a new shape is a new
//! schema ([`crate::SCHEMA`]).

use std::collections::BTreeMap;

use flotilla_scaler::{Lease, LeaseState, Millis};
use serde::{Deserialize, Serialize};

/// One lease's row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct LeaseRecord {
    id: u64,
    state: StateRecord,
    reserved_at: Millis,
    acquired_at: Option<Millis>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    expires_at: Option<Millis>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    deadline_at: Option<Millis>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tenant: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    handed_from: Option<String>,
}

/// Where the lease stood.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "kebab-case")]
enum StateRecord {
    Reserved,
    Acquired { instance: String, slot: u32 },
    Failed { cause: String },
}

impl From<&Lease> for LeaseRecord {
    fn from(lease: &Lease) -> LeaseRecord {
        LeaseRecord {
            id: lease.id,
            state: match &lease.state {
                LeaseState::Reserved => StateRecord::Reserved,
                LeaseState::Acquired { instance, slot } => StateRecord::Acquired {
                    instance: instance.clone(),
                    slot: *slot,
                },
                LeaseState::Failed { cause } => StateRecord::Failed {
                    cause: cause.clone(),
                },
            },
            reserved_at: lease.reserved_at,
            acquired_at: lease.acquired_at,
            labels: lease.labels.clone(),
            expires_at: lease.expires_at,
            deadline_at: lease.deadline_at,
            tenant: lease.tenant.clone(),
            handed_from: lease.handed_from.clone(),
        }
    }
}

impl From<LeaseRecord> for Lease {
    fn from(record: LeaseRecord) -> Lease {
        Lease {
            id: record.id,
            state: match record.state {
                StateRecord::Reserved => LeaseState::Reserved,
                StateRecord::Acquired { instance, slot } => LeaseState::Acquired { instance, slot },
                StateRecord::Failed { cause } => LeaseState::Failed { cause },
            },
            reserved_at: record.reserved_at,
            acquired_at: record.acquired_at,
            labels: record.labels,
            expires_at: record.expires_at,
            deadline_at: record.deadline_at,
            tenant: record.tenant,
            handed_from: record.handed_from,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A row as schema 1 and 2 wrote it, every optional field set.
    const FULL: &str = r#"{"id":8,"state":{"state":"acquired","instance":"m1","slot":2},"reserved_at":1000,"acquired_at":2000,"labels":{"gitlab-job":"9"},"expires_at":3000,"deadline_at":4000,"tenant":"project-77","handed_from":"spot"}"#;
    /// The same with none: the oldest rows have only these.
    const BARE: &str =
        r#"{"id":7,"state":{"state":"reserved"},"reserved_at":1000,"acquired_at":null}"#;
    const FAILED: &str = r#"{"id":9,"state":{"state":"failed","cause":"instance m1 failed"},"reserved_at":1000,"acquired_at":null}"#;

    /// Rows written before the record had a type of its own read back to the same lease and
    /// are written again byte for byte.
    #[test]
    fn the_rows_of_schema_2_read_and_write_unchanged() {
        for row in [FULL, BARE, FAILED] {
            let lease: Lease = serde_json::from_str::<LeaseRecord>(row).unwrap().into();
            let again = serde_json::to_string(&LeaseRecord::from(&lease)).unwrap();
            assert_eq!(again, row);
        }
        let full: Lease = serde_json::from_str::<LeaseRecord>(FULL).unwrap().into();
        assert_eq!(full.handed_from.as_deref(), Some("spot"));
        assert_eq!(
            full.state,
            LeaseState::Acquired {
                instance: "m1".into(),
                slot: 2
            }
        );
    }
}
