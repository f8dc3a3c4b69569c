//! The key `palisade fence` fences when `--key` is not given.
//!
//! **The default key** is `<namespace>/<lease>` from `PALISADE_NAMESPACE` and
//! `PALISADE_LEASE` (the lease name with only the lease, `default` with neither),
//! for every store: bare Lease names collide across namespaces in a shared database
//! or store. Older versions defaulted to the bare lease name, so changing the default
//! must not start a fence over: when the default key is namespaced, has no mark, and
//! the bare lease name has one, the file and PostgreSQL stores refuse (exit 1, naming
//! both keys, asking for `--key` or a migrated mark). PostgreSQL checks that inside
//! the admitting transaction, reading the old key through the function itself
//! (token 0 in a savepoint that is always rolled back), because a writer may not read
//! `palisade.marks`; the extra round trips happen only on a key's first mark. Redis
//! needs no such check: a key whose mark was never created fails closed there.
//!
//! **A semaphore's slot** (`crate::permits`) has a key of its own: the default key is
//! [`permits::fence_key`] of the namespace, the lease and the slot, from `--slot`
//! or else `PALISADE_SLOT` (which `palisade lock` sets, beside the token), so slot 0
//! keeps the lock's `<namespace>/<lease>` and the others are `<namespace>/<lease>#N`.
//! Read like `PALISADE_NAMESPACE` and `PALISADE_LEASE`, only for the default key,
//! not as a clap `env`: an explicit `--key` with `PALISADE_SLOT` in the environment
//! (under `palisade lock`) is fine, and only an explicit `--slot` conflicts with
//! `--key`. Slots above 0 never had a bare-lease-name key, so only slot 0's default
//! key is checked against it.

use std::error::Error;

use super::Refusal;
use crate::cli::parse_slot;
use crate::permits;

/// [`default_key`] from `PALISADE_NAMESPACE`, `PALISADE_LEASE` and the slot: `--slot`,
/// else `PALISADE_SLOT`, else 0.
pub(super) fn key_from_env(slot: Option<i32>) -> Result<(String, Option<String>), Refusal> {
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let slot = match (slot, env("PALISADE_SLOT")) {
        (Some(slot), _) => slot,
        (None, Some(text)) => parse_slot(&text)
            .map_err(|e| Refusal::Usage(format!("PALISADE_SLOT={text:?}: {e}").into()))?,
        (None, None) => 0,
    };
    default_key(env("PALISADE_NAMESPACE"), env("PALISADE_LEASE"), slot)
        .map_err(|e| Refusal::Usage(e.into()))
}

/// The key when `--key` is not given ([`permits::fence_key`] when both the namespace
/// and the lease are known), and, when it is slot 0's `<namespace>/<lease>`, the bare
/// lease name that palisade used as the default before. A slot above 0 needs the
/// lease: "default" would let every slot's holders share one mark.
fn default_key(
    namespace: Option<String>,
    lease: Option<String>,
    slot: i32,
) -> Result<(String, Option<String>), String> {
    Ok(match (namespace, lease) {
        (Some(namespace), Some(lease)) => {
            let key = permits::fence_key(&namespace, &lease, slot);
            (key, (slot == 0).then_some(lease))
        }
        (None, Some(lease)) if slot == 0 => (lease, None),
        (None, Some(lease)) => (format!("{lease}#{slot}"), None),
        (_, None) if slot == 0 => ("default".to_owned(), None),
        (_, None) => {
            return Err(format!(
                "slot {slot} (--slot or PALISADE_SLOT) is a slot of the Lease named in \
                 PALISADE_LEASE, which is not set: set it (and PALISADE_NAMESPACE), or pass --key"
            ));
        }
    })
}

/// The default key `<namespace>/<lease>` has no mark, but the bare lease name (the
/// default of older versions) has one: fencing under the new key would start over.
#[derive(Debug)]
pub(super) struct KeyMoved {
    pub(super) key: String,
    pub(super) lease_key: String,
    pub(super) highest: u64,
}

impl std::fmt::Display for KeyMoved {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let KeyMoved {
            key,
            lease_key,
            highest,
        } = self;
        write!(
            f,
            "the default key is {key:?} (<namespace>/<lease>), which has no mark in this \
             store, but the lease-name key {lease_key:?} (the default of older versions) \
             has one (highest admitted token {highest}); fencing under {key:?} would start \
             over. Pass --key explicitly (--key {lease_key} goes on with the existing mark), \
             or migrate the mark to {key:?}"
        )
    }
}

impl Error for KeyMoved {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_key_is_namespace_slash_lease() {
        let some = |s: &str| Some(s.to_owned());
        let key = |ns, lease| default_key(ns, lease, 0).unwrap();
        assert_eq!(
            key(some("payments"), some("billing")),
            ("payments/billing".to_owned(), some("billing"))
        );
        assert_eq!(key(None, some("billing")), ("billing".to_owned(), None));
        assert_eq!(key(some("payments"), None), ("default".to_owned(), None));
        assert_eq!(key(None, None), ("default".to_owned(), None));
    }

    #[test]
    fn a_slot_above_0_has_a_key_of_its_own_and_no_older_default() {
        let some = |s: &str| Some(s.to_owned());
        assert_eq!(
            default_key(some("payments"), some("billing"), 2),
            Ok(("payments/billing#2".to_owned(), None))
        );
        assert_eq!(
            default_key(None, some("billing"), 2),
            Ok(("billing#2".to_owned(), None))
        );
        for namespace in [None, some("payments")] {
            let err = default_key(namespace, None, 1).unwrap_err();
            assert!(err.contains("PALISADE_LEASE"), "{err}");
        }
    }
}
