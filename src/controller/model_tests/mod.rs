//! The grant decision and the index, without a cluster: unit tests of single
//! decisions ([`decisions`], [`expiry`]), and property tests that drive two real controller
//! loops with independently stale views against a model API server with
//! compare-and-swap writes ([`model`]).

mod decisions;
mod durations;
mod expiry;
mod model;
mod server;

use crate::controller::index::LeaseKey;
use crate::fixtures::NS;

const NAME: &str = "lock";

fn key() -> LeaseKey {
    LeaseKey::new(NS, NAME)
}
