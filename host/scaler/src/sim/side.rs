//! One pool of the simulation with its simulated cloud, and the pair a run drives (the pool
//! jobs come to and its fallback).

use std::collections::BTreeMap;

use super::engine::FALLBACK;
use super::{SimCloud, SimPool};
use crate::Millis;
use crate::ScalerConfig;
use crate::core::{LeaseIds, PoolCore};
use flotilla_provider::Instance;

/// One pool of the simulation and its cloud: the pool the jobs come to, or its fallback.
pub(super) struct Side<'a> {
    pub(super) cfg: &'a ScalerConfig,
    pub(super) cloud_cfg: &'a SimCloud,
    pub(super) core: PoolCore,
    /// The cloud's instances by number (`i-{n}`), in creation order, so `update()` lists them
    /// the same way on every run; each kept as `update()` lists it, so a listing lends them
    /// without a copy.
    pub(super) cloud: BTreeMap<u64, Instance>,
    pub(super) next_inst: u64,
    /// The core's `leases_failed` counter when the running leases were last checked.
    pub(super) leases_failed_seen: u64,
}

impl<'a> Side<'a> {
    pub(super) fn new(pool: &SimPool<'a>, start_at: Millis, ids: &LeaseIds) -> Side<'a> {
        let mut core = PoolCore::new(pool.cfg.clone(), pool.policies.to_vec(), start_at);
        core.share_lease_ids(ids.clone());
        core.set_provider_info(&flotilla_provider::ProviderInfo {
            id: "sim".into(),
            version: "0".into(),
            max_size: pool.cloud.max_size,
            heartbeat: false,
            expiring_connect_info: false,
        });
        Side {
            cfg: pool.cfg,
            cloud_cfg: pool.cloud,
            core,
            cloud: BTreeMap::new(),
            next_inst: 1,
            leases_failed_seen: 0,
        }
    }
}

/// The pool jobs come to, and its fallback when it has one.
pub(super) struct Sides<'a> {
    pub(super) first: Side<'a>,
    pub(super) fallback: Option<Side<'a>>,
}

impl<'a> Sides<'a> {
    /// Side `i`: the fallback for [`FALLBACK`] when there is one, else the first.
    pub(super) fn get(&self, i: usize) -> &Side<'a> {
        match (i, &self.fallback) {
            (FALLBACK, Some(f)) => f,
            _ => &self.first,
        }
    }

    pub(super) fn get_mut(&mut self, i: usize) -> &mut Side<'a> {
        match (i, &mut self.fallback) {
            (FALLBACK, Some(f)) => f,
            _ => &mut self.first,
        }
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = &Side<'a>> {
        std::iter::once(&self.first).chain(&self.fallback)
    }

    pub(super) fn len(&self) -> usize {
        1 + usize::from(self.fallback.is_some())
    }
}
