//! Where the scaler's lease becomes the wire's: every lease an answer carries goes through
//! [`view`], so the HTTP lease is `flotilla_api::LeaseView` whatever the scaler keeps.

use flotilla_api::{LeaseState as WireState, LeaseView};
use flotilla_scaler::{Lease, LeaseState};

/// The lease as the API shows it.
pub(super) fn view(lease: &Lease) -> LeaseView {
    LeaseView {
        id: lease.id,
        state: match &lease.state {
            LeaseState::Reserved => WireState::Reserved,
            LeaseState::Acquired { instance, slot } => WireState::Acquired {
                instance: instance.clone(),
                slot: *slot,
            },
            LeaseState::Failed { cause } => WireState::Failed {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Leases in every state, with every optional field set and with none.
    fn leases() -> Vec<Lease> {
        let bare = Lease {
            id: 7,
            state: LeaseState::Reserved,
            reserved_at: 1_000,
            acquired_at: None,
            labels: Default::default(),
            expires_at: None,
            deadline_at: None,
            tenant: None,
            handed_from: None,
        };
        let full = Lease {
            id: 8,
            state: LeaseState::Acquired {
                instance: "m1".into(),
                slot: 2,
            },
            acquired_at: Some(2_000),
            labels: [("gitlab-job".to_string(), "9".to_string())].into(),
            expires_at: Some(3_000),
            deadline_at: Some(4_000),
            tenant: Some("project-77".into()),
            handed_from: Some("spot".into()),
            ..bare.clone()
        };
        let failed = Lease {
            id: 9,
            state: LeaseState::Failed {
                cause: "instance m1 failed".into(),
            },
            ..bare.clone()
        };
        vec![bare, full, failed]
    }

    /// The wire's lease says everything the scaler's does, under the same names: a field
    /// added to one and not the other fails here.
    #[test]
    fn the_wire_lease_carries_every_field_of_the_scalers() {
        for lease in leases() {
            let scaler = serde_json::to_value(&lease).expect("the scaler's lease");
            let wire = serde_json::to_value(view(&lease)).expect("the wire's lease");
            assert_eq!(wire, scaler);
            let back: LeaseView = serde_json::from_value(wire).expect("a client reads it");
            assert_eq!(back, view(&lease));
        }
    }
}
