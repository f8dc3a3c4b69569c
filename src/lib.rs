//! palisade: Kubernetes leases with fencing tokens.
//!
//! A grant of a [`api::Lease`] carries a strictly increasing fencing token; the
//! protected resource rejects writes with a token lower than the highest it has
//! seen. See DESIGN.md for the contract.

pub mod api;
pub mod cli;
pub mod client;
pub mod controller;
pub mod election;
pub mod error;
pub mod events;
pub mod fence;
pub mod grant;
pub mod index;
pub mod kube_client;
pub mod telemetry;
pub mod token;
pub mod watch;
