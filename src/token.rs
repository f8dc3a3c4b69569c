//! Fencing-token arithmetic (DESIGN rule 3).
//!
//! `token = max(status.fencingToken + 1, rv + 1)`, where `rv` is the Lease
//! resourceVersion that the granting write is conditioned on. The write that
//! publishes the token gets a resourceVersion greater than `rv`, so every token
//! is at most the resourceVersion that published it. resourceVersions grow
//! across the whole resource type, so tokens keep increasing even when a Lease
//! is deleted and re-created under the same name.
//!
//! # Token ceiling
//!
//! The controller issues no token above [`MAX_TOKEN`], 999,999,999,999,999,999 (18
//! digits, what the object-fencing policy accepts: CEL's `int()` cannot overflow on
//! them). A Lease whose next token would exceed it (someone with `leases/status` set
//! `fencingToken` near the int64 maximum) is not granted: claims keep waiting and
//! condition `Held` is `False` with reason `TokensExhausted`, naming the token.
//! Deleting and re-creating the Lease starts over above its new resourceVersion;
//! fenced resources that admitted the huge token keep refusing lower ones, which is
//! what fencing promises.
//!
//! # Marks hold tokens, not holders
//!
//! Every fence admits a token *equal* to its mark (a holder writes many times with
//! one token), so an etcd restore without `--bump-revision` (DESIGN.md rule 3), which
//! can issue a token twice, could let two holders both write. Considered and not
//! done: marks that record the holder's claim UID and refuse an equal token from
//! another holder. Every fence's interface (the SQL function, the Redis script, the
//! file store, the admission policy) would take a holder argument, for a case the
//! restore procedure excludes.

/// The highest token palisade issues: 18 decimal digits, the most that the object-fencing
/// admission policy (and any enforcement point parsing into a 64-bit integer with room
/// to compare) accepts. A Lease whose next token would exceed it is not granted again
/// ("Token ceiling" above).
pub const MAX_TOKEN: i64 = 999_999_999_999_999_999;

/// The token for the next grant, and whether the resourceVersion took part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NextToken {
    pub token: i64,
    /// False when the resourceVersion did not parse as an integer and the token
    /// fell back to `fencingToken + 1` (reported in a condition).
    pub from_resource_version: bool,
}

/// No token above the last one fits under [`MAX_TOKEN`]: granting would repeat or
/// saturate a token, so the Lease is not granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokensExhausted {
    /// The token the next grant would need (saturated at `i64::MAX`).
    pub needed: i64,
}

/// Computes the next token from the last one issued on this Lease object (if
/// any) and the resourceVersion the grant is conditioned on; refuses rather than
/// repeat or saturate a token.
pub fn next_token(last: Option<i64>, resource_version: &str) -> Result<NextToken, TokensExhausted> {
    let after_last = last.unwrap_or(0).max(0).checked_add(1);
    let next = match parse_resource_version(resource_version) {
        Some(rv) => NextToken {
            token: after_last
                .zip(rv.checked_add(1))
                .map_or(i64::MAX, |(a, b)| a.max(b)),
            from_resource_version: true,
        },
        None => NextToken {
            token: after_last.unwrap_or(i64::MAX),
            from_resource_version: false,
        },
    };
    if next.token > MAX_TOKEN {
        return Err(TokensExhausted { needed: next.token });
    }
    Ok(next)
}

/// A resourceVersion read as an integer: decimal digits only, no sign, no
/// leading zeros, fits in i64 (KEP-5504: comparable resourceVersions).
pub fn parse_resource_version(rv: &str) -> Option<i64> {
    let well_formed = !rv.is_empty()
        && rv.bytes().all(|b| b.is_ascii_digit())
        && !(rv.len() > 1 && rv.starts_with('0'));
    if well_formed { rv.parse().ok() } else { None }
}

/// Orders two resourceVersions of one resource when both are integers.
pub fn resource_version_newer(candidate: &str, current: &str) -> Option<bool> {
    Some(parse_resource_version(candidate)? > parse_resource_version(current)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn first_grant_is_above_the_resource_version() {
        assert_eq!(next_token(None, "41").unwrap().token, 42);
    }

    #[test]
    fn last_token_wins_when_it_is_higher() {
        // A Lease whose token came from a higher resourceVersion elsewhere.
        assert_eq!(next_token(Some(100), "41").unwrap().token, 101);
    }

    #[test]
    fn unparseable_resource_version_falls_back_to_counter() {
        for rv in ["", "abc", "-5", "+5", "007", "1.5", "99999999999999999999"] {
            let next = next_token(Some(9), rv).unwrap();
            assert_eq!(next.token, 10, "rv {rv:?}");
            assert!(!next.from_resource_version, "rv {rv:?}");
        }
    }

    #[test]
    fn negative_or_missing_last_token_counts_as_zero() {
        assert_eq!(next_token(Some(-3), "x").unwrap().token, 1);
        assert_eq!(next_token(None, "x").unwrap().token, 1);
    }

    #[test]
    fn a_token_at_the_maximum_is_never_repeated_or_saturated() {
        assert_eq!(
            next_token(Some(MAX_TOKEN - 1), "41").unwrap().token,
            MAX_TOKEN
        );
        for last in [MAX_TOKEN, MAX_TOKEN + 1, i64::MAX - 1, i64::MAX] {
            for rv in ["41", "x", "9223372036854775807"] {
                assert!(
                    next_token(Some(last), rv).is_err(),
                    "last {last}, rv {rv}: {:?}",
                    next_token(Some(last), rv)
                );
            }
        }
        assert!(next_token(None, "9223372036854775807").is_err());
    }

    #[test]
    fn resource_versions_compare_as_integers() {
        assert_eq!(resource_version_newer("100", "99"), Some(true));
        assert_eq!(resource_version_newer("99", "100"), Some(false));
        assert_eq!(resource_version_newer("a", "100"), None);
    }

    proptest! {
        /// Simulates grants where each write's new resourceVersion exceeds the
        /// one it was conditioned on (what the API server guarantees), with
        /// re-creations that reset the status: tokens strictly increase and each
        /// token is at most the resourceVersion of the write that published it.
        #[test]
        fn tokens_strictly_increase_across_grants_and_recreation(
            steps in proptest::collection::vec((1u32..50, any::<bool>()), 1..200)
        ) {
            let mut rv: i64 = 1;
            let mut last: Option<i64> = None;
            let mut previous_token = 0;
            for (gap, recreate) in steps {
                if recreate {
                    last = None; // a new Lease object starts with an empty status
                    rv += 1;     // its creation is a write too
                }
                let next = next_token(last, &rv.to_string()).unwrap();
                let written_rv = rv + i64::from(gap);
                prop_assert!(next.token > previous_token);
                prop_assert!(next.token <= written_rv);
                previous_token = next.token;
                last = Some(next.token);
                rv = written_rv;
            }
        }
    }
}
