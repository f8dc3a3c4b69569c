//! `palisade lock --slot N` and `--permits N`: one slot of a semaphore asked for, and
//! the permits of a Lease this command creates (`crate::permits`).
//!
//! Both are checked before anything is written, with errors that name the flag: a
//! value out of range when the flags are parsed (`cli::parse_slot`, `parse_permits`:
//! clap's exit 2), and a `--slot` that the Lease as read does not have (at or above
//! its `spec.permits`) here, before the claim is made (exit 2), since a claim for a
//! slot that does not exist would wait for as long as nobody raises `permits`. An
//! existing Lease keeps its `permits`, as it keeps its duration.

/// A `--slot` the Lease does not have.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "--slot {slot} is not a slot of lease {lease}: it has {permits} permit(s), so slots 0 to \
     {last} (an existing Lease keeps its spec.permits; --permits only applies when this \
     command creates the Lease)",
    last = permits - 1
)]
pub struct NoSuchSlot {
    pub slot: i32,
    pub lease: String,
    pub permits: i32,
}

/// Refuses a `--slot` at or above the Lease's `spec.permits`.
pub fn check_slot(slot: Option<i32>, lease: &str, permits: i32) -> Result<(), NoSuchSlot> {
    let permits = permits.max(1);
    match slot {
        Some(slot) if slot >= permits => Err(NoSuchSlot {
            slot,
            lease: lease.to_owned(),
            permits,
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_the_lease_does_not_have_is_refused_naming_the_flag() {
        assert_eq!(check_slot(None, "l", 1), Ok(()));
        assert_eq!(check_slot(Some(0), "l", 1), Ok(()));
        assert_eq!(check_slot(Some(2), "l", 3), Ok(()));
        let err = check_slot(Some(3), "l", 3).unwrap_err();
        assert_eq!(
            (err.slot, err.lease.as_str(), err.permits),
            (3, "l", 3),
            "{err}"
        );
        let text = err.to_string();
        assert!(
            text.starts_with("--slot 3 is not a slot of lease l") && text.contains("slots 0 to 2"),
            "{text}"
        );
        assert!(
            check_slot(Some(1), "l", 1).is_err(),
            "a lock has slot 0 only"
        );
    }
}
