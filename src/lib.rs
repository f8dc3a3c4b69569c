//! palisade: Kubernetes leases with fencing tokens.
//!
//! A grant of a [`crd::Lease`] carries a strictly increasing fencing token; the
//! protected resource rejects writes with a token lower than the highest it has
//! seen. See DESIGN.md for the contract.
//!
//! # Features
//!
//! | feature | what it adds | heavy dependencies |
//! | --- | --- | --- |
//! | `client` | [`crd`], [`permits`], [`client`], [`conditions`], [`kube_client`], [`kube_error`]: the CRD types, the client library and the reasons it reports | kube, tokio |
//! | `fence` | [`fence`]: the fencing rule, [`fence::FileStore`] and [`fence::MemoryStore`] | none |
//! | `postgres` | [`fence::postgres`] (implies `fence`) | tokio-postgres |
//! | `redis` | [`fence::redis`] (implies `fence`) | redis |
//! | `mysql` | [`fence::mysql`] (implies `fence`) | mysql_async |
//! | `s3` | [`fence::s3`]: object stores with conditional writes (implies `fence`) | hyper, rusty-s3 |
//! | `outbox` | [`outbox`]: the fenced outbox and its relay (implies `postgres`, `client`) | none beyond those |
//! | `controller` | [`controller`] (with its [`controller::metrics`]) and [`admin`]: the lease controller (implies `client`) | axum, prometheus-client |
//! | `agent` | [`agent`] and [`admin`]: `palisade agent`, the per-pod sidecar's local HTTP API (implies `client`) | axum, prometheus-client |
//! | `cli` | the `palisade` binary (implies `client`, `fence`, `controller`, `agent`) | clap, tracing-subscriber |
//! | `operator` | [`operator`]: a fenced operator's client and leadership (implies `client`) | none beyond `client` |
//!
//! `default` is the full build: `cli`, `postgres`, `redis`, `mysql`, `s3`, `outbox` and `operator`. A program that takes
//! a Lease and fences its writes needs only
//! `palisade = { version = "0.3", default-features = false, features = ["client", "fence"] }`.
//!
//! Why split this way: a worker that only takes Leases and fences its writes then
//! compiles no HTTP server, metrics or argument parser. Everything only the
//! `palisade` binary does (flags, messages, exit codes, the runtime, logging, the
//! identity default, `palisade lock`'s process supervision) lives in `cli`, whose
//! module docs say why; a Rust program that holds a [`client::Grant`] stops its own
//! work on [`client::Grant::lost`].
//!
//! # Entry points
//!
//! - Take a Lease: [`client::LeaseClient::acquire`], which returns a [`client::Grant`]
//!   (the fencing token, the loss of the lease, the release).
//! - Enforce a token at the resource: [`fence::Fence::admit`] on a
//!   [`fence::FileStore`], or the database's own check with [`fence::postgres::admit`]
//!   and [`fence::redis::RedisFence::admit`].
//! - Run the controller in a program of your own: [`controller::run`].
//!
//! A worker that takes a Lease and writes with its token (features `client` and `fence`):
//!
//! ```no_run
//! use palisade::client::{AcquireOptions, LeaseClient};
//! use palisade::fence::{Fence, FileStore};
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let leases = LeaseClient::try_default(Some("payments")).await?;
//! let grant = leases.acquire("ledger", AcquireOptions::default()).await?;
//! let token = u64::try_from(grant.token())?; // tokens are positive
//! let fence = Fence::new(FileStore::open("/var/lib/ledger/fence")?);
//! tokio::select! {
//!     reason = grant.lost() => eprintln!("lost the lease: {reason}"),
//!     written = async { fence.admit_write("ledger", token, "credit 10") } => {
//!         written?;
//!     }
//! }
//! grant.release().await?;
//! # Ok(()) }
//! ```
//!
//! `cli` (for the binary and the tests) and the controller's `election` (for the tests)
//! are public for those only; they are not part of the API.

#![cfg_attr(docsrs, feature(doc_cfg))]
// A function longer than a screen (80 lines, clippy.toml) hides its steps: split it.
#![warn(clippy::too_many_lines)]

#[cfg(any(feature = "controller", feature = "agent"))]
pub mod admin;
#[cfg(feature = "agent")]
pub mod agent;
#[cfg(feature = "cli")]
#[doc(hidden)]
pub mod cli;
#[cfg(feature = "client")]
pub mod client;
#[cfg(feature = "client")]
pub mod conditions;
#[cfg(feature = "controller")]
pub mod controller;
#[cfg(feature = "client")]
pub mod crd;
#[cfg(feature = "fence")]
pub mod fence;
#[cfg(all(test, feature = "client"))]
mod fixtures;
#[cfg(feature = "client")]
pub mod kube_client;
#[cfg(feature = "client")]
pub mod kube_error;
#[cfg(feature = "operator")]
pub mod operator;
#[cfg(feature = "outbox")]
pub mod outbox;
#[cfg(feature = "client")]
pub mod permits;
pub mod token;
#[cfg(feature = "client")]
mod watch_backoff;
