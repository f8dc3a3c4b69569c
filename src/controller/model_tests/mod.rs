//! The grant decision and the index, without a cluster: unit tests of single
//! decisions ([`decisions`], [`expiry`]), and property tests that drive two real controller
//! loops with independently stale views against a model API server with
//! compare-and-swap writes ([`model`]).

mod decisions;
mod durations;
mod expiry;
mod handovers;
mod model;
mod semaphores;
mod server;

use crate::controller::index::LeaseKey;
use crate::crd::LeaseClaim;
use crate::fixtures::{ClaimBuilder, NS};

const NAME: &str = "lock";

fn key() -> LeaseKey {
    LeaseKey::new(NS, NAME)
}

/// A claim on the test Lease, seen once (resourceVersion 1), created `created`
/// seconds after the fixtures' epoch: its place in the queue.
fn claim(name: &str, uid: &str, created: i64) -> LeaseClaim {
    ClaimBuilder::new(name, NAME)
        .uid(uid)
        .resource_version(1)
        .created(created)
        .build()
}
