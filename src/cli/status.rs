//! `palisade status [LEASE]`: the Leases of a namespace as a table and, for one
//! Lease, the claims waiting for it in grant order.
//!
//! A semaphore (`spec.permits` above 1, `crate::permits`) has a row per slot, named
//! `LEASE#SLOT` (slot 0 included), each with the slot's holder, its token (the last
//! one when free) and whether it is held; WAITING is the Lease's queue, which every
//! slot shares. Slots at or above a lowered `permits` are shown while still held. A
//! lock keeps its one row, named as the Lease.

use std::process::ExitCode;

use kube::ResourceExt;
use kube::api::ListParams;

use super::{Threads, block_on, init_logging};
use crate::client::{self, LeaseClient, call};
use crate::crd::{ClaimPhase, Lease, LeaseClaim, LeasePhase, SlotStatus};

/// Show Leases: holder, fencing token, phase and how many claims wait.
#[derive(clap::Args, Debug)]
pub struct StatusArgs {
    /// Namespace [default: $POD_NAMESPACE, else the kubeconfig's namespace].
    #[arg(short = 'n', long, env = "POD_NAMESPACE")]
    pub namespace: Option<String>,

    /// Show only this Lease, followed by the queue of claims waiting for it.
    pub lease: Option<String>,
}

pub fn run(args: StatusArgs) -> ExitCode {
    init_logging("warn", false);
    block_on("status", Threads::One, async {
        match status(args).await {
            Ok(out) => {
                print!("{out}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("palisade status: {e}");
                ExitCode::FAILURE
            }
        }
    })
}

/// Why `palisade status` printed no table.
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    #[error("no Kubernetes client configuration (KUBECONFIG or in-cluster): {0}")]
    NoConfig(kube::Error),
    /// A call failed; `doing` says which, in which namespace.
    #[error("{doing}: {error}")]
    Api { doing: String, error: client::Error },
    #[error("lease {name} not found in namespace {namespace}")]
    NotFound { name: String, namespace: String },
}

async fn status(args: StatusArgs) -> Result<String, StatusError> {
    let client = LeaseClient::try_default(args.namespace.as_deref())
        .await
        .map_err(StatusError::NoConfig)?;
    let ns = client.namespace().to_string();
    let failed = |doing: String| move |error: client::Error| StatusError::Api { doing, error };
    let Some(name) = args.lease else {
        let leases = call(
            || format!("listing leases in namespace {ns}"),
            client.leases().list(&ListParams::default()),
        )
        .await
        .map_err(failed(format!("listing leases in namespace {ns}")))?;
        if leases.items.is_empty() {
            return Ok(format!("No leases found in namespace {ns}.\n"));
        }
        let mut leases = leases.items;
        leases.sort_by_key(|l| l.name_any());
        return Ok(lease_table(&leases));
    };
    let lease = call(
        || format!("reading lease {name}"),
        client.leases().get_opt(&name),
    )
    .await
    .map_err(failed(format!("reading lease {name} in namespace {ns}")))?
    .ok_or_else(|| StatusError::NotFound {
        name: name.clone(),
        namespace: ns.clone(),
    })?;
    // spec.leaseName is a selectable field of LeaseClaim.
    let claims = call(
        || format!("listing claims of lease {name}"),
        client
            .claims()
            .list(&ListParams::default().fields(&format!("spec.leaseName={name}"))),
    )
    .await
    .map_err(failed(format!(
        "listing claims of lease {name} in namespace {ns}"
    )))?;
    Ok(format!(
        "{}\n{}",
        lease_table(std::slice::from_ref(&lease)),
        queue_table(&claims.items)
    ))
}

/// NAME HOLDER TOKEN PHASE WAITING, one row per Lease, and per slot of a semaphore.
pub fn lease_table(leases: &[Lease]) -> String {
    let mut rows = vec![row(["NAME", "HOLDER", "TOKEN", "PHASE", "WAITING"])];
    for lease in leases {
        let status = lease.status.clone().unwrap_or_default();
        let waiting = status.waiting_count.unwrap_or(0).to_string();
        let Some(slots) = semaphore_slots(lease) else {
            rows.push(vec![
                lease.name_any(),
                holder_cell(status.holder.as_ref()),
                token_cell(status.fencing_token),
                match status.phase {
                    Some(LeasePhase::Held) => "Held".into(),
                    Some(LeasePhase::Free) => "Free".into(),
                    None => NONE.into(),
                },
                waiting,
            ]);
            continue;
        };
        for slot in slots {
            let phase = if slot.holder.is_some() {
                "Held"
            } else {
                "Free"
            };
            rows.push(vec![
                format!("{}#{}", lease.name_any(), slot.slot),
                holder_cell(slot.holder.as_ref()),
                token_cell(slot.fencing_token),
                phase.into(),
                waiting.clone(),
            ]);
        }
    }
    table(&rows)
}

/// A semaphore's slots to show, in slot order: every slot below `spec.permits`
/// (free and never granted: no row in the status), and any above it still held.
/// None for a lock: `permits` 1 and no other slot held.
fn semaphore_slots(lease: &Lease) -> Option<Vec<SlotStatus>> {
    let permits = lease.spec.permits.max(1);
    let status = lease.status.clone().unwrap_or_default();
    let rows = status.slot_rows();
    let held_above = rows.iter().any(|r| r.slot >= permits && r.holder.is_some());
    if permits == 1 && !held_above {
        return None;
    }
    let mut shown: Vec<SlotStatus> = (0..permits)
        .map(|slot| SlotStatus {
            slot,
            ..SlotStatus::default()
        })
        .collect();
    for row in rows {
        match shown.iter_mut().find(|s| s.slot == row.slot) {
            Some(s) => *s = row,
            None if row.holder.is_some() => shown.push(row),
            None => {}
        }
    }
    Some(shown)
}

fn holder_cell(holder: Option<&crate::crd::Holder>) -> String {
    holder.map_or_else(|| NONE.into(), |h| h.identity.clone())
}

fn token_cell(token: Option<i64>) -> String {
    token.map_or_else(|| NONE.into(), |t| t.to_string())
}

/// The claims still waiting, in the order the controller grants them (DESIGN rule 5:
/// creationTimestamp, then name).
pub fn queue_table(claims: &[LeaseClaim]) -> String {
    let mut waiting: Vec<&LeaseClaim> = claims
        .iter()
        .filter(|c| {
            c.metadata.deletion_timestamp.is_none()
                && matches!(
                    c.status.as_ref().and_then(|s| s.phase),
                    None | Some(ClaimPhase::Pending)
                )
        })
        .collect();
    if waiting.is_empty() {
        return "No claims waiting.\n".to_string();
    }
    waiting.sort_by_key(|c| {
        (
            c.metadata.creation_timestamp.as_ref().map(|t| t.0),
            c.name_any(),
        )
    });
    let mut rows = vec![row(["POSITION", "CLAIM", "HOLDER"])];
    for (i, claim) in waiting.iter().enumerate() {
        rows.push(vec![
            (i + 1).to_string(),
            claim.name_any(),
            claim.spec.holder_identity.clone(),
        ]);
    }
    table(&rows)
}

const NONE: &str = "<none>";

fn row<const N: usize>(cells: [&str; N]) -> Vec<String> {
    cells.iter().map(|c| c.to_string()).collect()
}

/// Left-aligned columns separated by three spaces, like kubectl's.
fn table(rows: &[Vec<String>]) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|i| rows.iter().map(|r| r[i].len()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for r in rows {
        let line: Vec<String> = r
            .iter()
            .zip(&widths)
            .map(|(cell, width)| format!("{cell:width$}"))
            .collect();
        out.push_str(line.join("   ").trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{ClaimBuilder, LeaseBuilder};

    #[test]
    fn leases_are_listed_with_holder_token_phase_and_waiting() {
        let held = LeaseBuilder::new("billing")
            .no_namespace()
            .phase(LeasePhase::Held)
            .holder("billing-w0-abcde", "u", "worker-0")
            .granted_with(15)
            .token(1839)
            .waiting_count(2)
            .build();
        let fresh = LeaseBuilder::new("new").no_namespace().build();
        assert_eq!(
            lease_table(&[held, fresh]),
            "NAME      HOLDER     TOKEN    PHASE    WAITING\n\
             billing   worker-0   1839     Held     2\n\
             new       <none>     <none>   <none>   0\n"
        );
    }

    #[test]
    fn a_semaphore_has_a_row_per_slot_with_its_own_holder_and_token() {
        let semaphore = LeaseBuilder::new("pool")
            .no_namespace()
            .permits(3)
            .phase(LeasePhase::Held)
            .holder("pool-a-abcde", "ua", "worker-a")
            .token(12)
            .slot_holder(2, "pool-c-fghjk", "uc", "worker-c", 14)
            .waiting_count(1)
            .build();
        assert_eq!(
            lease_table(&[semaphore]),
            "NAME     HOLDER     TOKEN    PHASE   WAITING\n\
             pool#0   worker-a   12       Held    1\n\
             pool#1   <none>     <none>   Free    1\n\
             pool#2   worker-c   14       Held    1\n"
        );
        // permits lowered to 2: slot 2 shown while still held, free rows above hidden.
        let lowered = LeaseBuilder::new("pool")
            .no_namespace()
            .permits(2)
            .free_slot(1, 9)
            .slot_holder(2, "pool-c-fghjk", "uc", "worker-c", 14)
            .free_slot(3, 11)
            .build();
        assert_eq!(
            lease_table(&[lowered]),
            "NAME     HOLDER     TOKEN    PHASE   WAITING\n\
             pool#0   <none>     <none>   Free    0\n\
             pool#1   <none>     9        Free    0\n\
             pool#2   worker-c   14       Held    0\n"
        );
    }

    #[test]
    fn the_queue_is_in_creation_order_and_skips_claims_that_are_not_waiting() {
        let claim = |name: &str, second: i64, phase: Option<ClaimPhase>| {
            ClaimBuilder::new(name, "l")
                .no_namespace()
                .holder_identity(&format!("id-{name}"))
                .created(second)
                .phase(phase)
                .build()
        };
        let claims = [
            claim("zz", 1, Some(ClaimPhase::Pending)),
            claim("holder", 0, Some(ClaimPhase::Granted)),
            claim("aa", 2, None),
            claim("old", 0, Some(ClaimPhase::Expired)),
            claim("bb", 2, Some(ClaimPhase::Pending)),
        ];
        assert_eq!(
            queue_table(&claims),
            "POSITION   CLAIM   HOLDER\n\
             1          zz      id-zz\n\
             2          aa      id-aa\n\
             3          bb      id-bb\n"
        );
        assert_eq!(queue_table(&claims[1..2]), "No claims waiting.\n");
    }
}
