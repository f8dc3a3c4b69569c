//! The verdict over a whole run, whatever the scenario, from the log of what the
//! holders said: the fence's (per key, so per slot of a semaphore), the grants' (each
//! in a slot of the Lease under that slot's key, tokens strictly increasing per slot)
//! and the holders' beliefs (never more at once than the Lease has permits).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use palisade::permits::fence_key;

use crate::holder::{Entry, Said};

/// The Lease a run's holders contend for.
pub struct LeaseTerms<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub permits: u32,
}

pub fn check(entries: &[Entry], lease: &LeaseTerms) -> Result<(), String> {
    no_stale_write_admitted(entries)?;
    grants_in_their_slots(entries, lease)?;
    let (most, who) = most_believed(entries);
    if most > lease.permits as usize {
        return Err(format!(
            "{most} holders believed their grants at once, with {} permit(s): {}",
            lease.permits,
            who.join(", ")
        ));
    }
    Ok(())
}

/// The fence's verdict: under each key, after a grant's first admitted write, no
/// holder of an earlier grant had a write admitted.
fn no_stale_write_admitted(entries: &[Entry]) -> Result<(), String> {
    let mut highest: HashMap<&str, u64> = HashMap::new();
    for e in entries {
        if let Said::Wrote {
            token,
            fence_key,
            admitted: true,
        } = &e.said
        {
            let mark = highest.entry(fence_key).or_default();
            if token < mark {
                return Err(format!(
                    "{} had a write with token {token} admitted under {fence_key} after token {mark}",
                    e.holder
                ));
            }
            *mark = *token;
        }
    }
    Ok(())
}

/// Every grant names a slot of the Lease and that slot's key (a lock: slot 0, key
/// `<namespace>/<lease>`), and each slot's tokens strictly increase, grant after grant.
fn grants_in_their_slots(entries: &[Entry], lease: &LeaseTerms) -> Result<(), String> {
    let mut last_token: BTreeMap<u32, u64> = BTreeMap::new();
    for e in entries {
        let Said::Granted(grant) = &e.said else {
            continue;
        };
        let slot = grant.slot;
        let expected_key = fence_key(lease.namespace, lease.name, slot as i32);
        if slot >= lease.permits || grant.fence_key != expected_key {
            return Err(format!(
                "{} was granted slot {slot} under key {} (the Lease has {} permit(s); that slot's key is {expected_key})",
                e.holder, grant.fence_key, lease.permits
            ));
        }
        if let Some(last) = last_token.insert(slot, grant.token)
            && grant.token <= last
        {
            return Err(format!(
                "{} was granted slot {slot} with token {} after token {last}",
                e.holder, grant.token
            ));
        }
    }
    Ok(())
}

/// The most holders that believed their grants at once, and who they were. A holder
/// believes from its `granted` line until it says `lost` or `released` or exits, or
/// until the suite stopped it, asked it to release (SIGTERM) or killed it: from then on
/// what it does is the fence's to judge (a stopped process acts on no belief; a
/// release frees the slot before the driver can say `released`).
pub fn most_believed(entries: &[Entry]) -> (usize, Vec<String>) {
    let mut believers: BTreeSet<&str> = BTreeSet::new();
    let mut most: (usize, Vec<String>) = (0, Vec::new());
    for e in entries {
        match &e.said {
            Said::Granted(_) => {
                believers.insert(&e.holder);
                if believers.len() > most.0 {
                    most = (
                        believers.len(),
                        believers.iter().map(|h| h.to_string()).collect(),
                    );
                }
            }
            Said::Lost(_) | Said::Released | Said::Exited(_) => {
                believers.remove(e.holder.as_str());
            }
            Said::Signalled(libc::SIGSTOP | libc::SIGTERM | libc::SIGKILL) => {
                believers.remove(e.holder.as_str());
            }
            Said::Signalled(_) | Said::Wrote { .. } => {}
        }
    }
    most
}
