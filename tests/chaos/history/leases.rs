//! The checker's rules on the Leases themselves: their versions as the harness's watch
//! saw them (slot by slot: a semaphore's slots are independent sequences of grants,
//! each with its own tokens), the grants the workers were given, and what each holder
//! believed (the timing contract), against how many may hold a Lease at once.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::{Event, Expectations, Verdict, slot_key};

/// A slot of a Lease: (Lease, slot).
type SlotOf<'a> = (&'a str, i32);

/// Tokens per slot are issued once (one claim per (Lease, slot, token): the grants of one
/// write share a token in different slots) and, along the Lease's versions, a slot's
/// token never decreases and strictly increases when its holder changes.
pub(super) fn check_grants(events: &[Event], v: &mut Verdict) {
    let mut holders: HashMap<(&str, i32, u64), &str> = HashMap::new();
    let mut seen: BTreeMap<SlotOf, Vec<(u64, &str, u64)>> = BTreeMap::new();
    for e in events {
        let (lease, slot, token, uid) = match e {
            Event::Grant {
                lease,
                slot,
                token,
                claim_uid,
                ..
            } => (lease, *slot, *token, claim_uid),
            Event::LeaseSeen {
                lease,
                slot,
                rv,
                holder_uid,
                token,
                ..
            } => {
                seen.entry((lease, *slot))
                    .or_default()
                    .push((*rv, holder_uid, *token));
                if holder_uid.is_empty() {
                    continue;
                }
                (lease, *slot, *token, holder_uid)
            }
            _ => continue,
        };
        match holders.get(&(lease.as_str(), slot, token)) {
            Some(other) if *other != uid => v.violations.push(format!(
                "lease {}: token {token} was issued twice, to claims {other} and {uid}",
                slot_key(lease, slot)
            )),
            _ => {
                holders.insert((lease, slot, token), uid);
            }
        }
    }
    v.grants = holders.len();
    for ((lease, slot), mut versions) in seen {
        let key = slot_key(lease, slot);
        versions.sort_by_key(|(rv, _, _)| *rv);
        versions.dedup();
        let mut last: Option<(u64, &str, u64)> = None;
        let mut last_holder: Option<(&str, u64)> = None;
        for (rv, uid, token) in versions {
            if let Some((prev_rv, _, prev_token)) = last
                && token < prev_token
            {
                v.violations.push(format!(
                    "lease {key}: token went down from {prev_token} (rv {prev_rv}) to {token} (rv {rv})"
                ));
            }
            if !uid.is_empty() {
                if let Some((prev_uid, prev_token)) = last_holder
                    && prev_uid != uid
                    && token <= prev_token
                {
                    v.violations.push(format!(
                        "lease {key}: holder changed from {prev_uid} to {uid} at rv {rv} \
                         without a higher token ({prev_token} -> {token})"
                    ));
                }
                last_holder = Some((uid, token));
            }
            last = Some((rv, uid, token));
        }
    }
}

/// A holder the harness silenced is expired in time, however the controller's
/// leadership changed meanwhile: its slot of its Lease names another holder (or none)
/// within the bound the fault recorded, as the harness's watch or another worker's
/// grant of that slot shows (another slot's changes leave it holding).
pub(super) fn check_silenced_holders_expire(events: &[Event], v: &mut Verdict) {
    for e in events {
        let Event::Silenced {
            lease,
            slot,
            claim_uid,
            t_ns,
            within_ns,
        } = e
        else {
            continue;
        };
        // Either sighting proves the slot had moved on by then: the harness's watch
        // (which may lag, its connection cut by a fault) or another worker's grant.
        let within = |at: &u64| *at > *t_ns && *at <= t_ns + within_ns;
        let moved_on = events.iter().any(|seen| match seen {
            Event::LeaseSeen {
                lease: l,
                slot: s,
                holder_uid,
                t_ns: at,
                ..
            } => l == lease && s == slot && holder_uid != claim_uid && within(at),
            Event::Grant {
                lease: l,
                slot: s,
                claim_uid: granted,
                t_ns: at,
                ..
            } => l == lease && s == slot && granted != claim_uid && within(at),
            _ => false,
        });
        if !moved_on {
            v.violations.push(format!(
                "lease {}: holder {claim_uid}, silent from {} ms, was not expired within \
                 {} ms",
                slot_key(lease, *slot),
                t_ns / 1_000_000,
                within_ns / 1_000_000
            ));
        }
    }
}

/// A claim's phase never moves back: once a renewal's response showed a final phase
/// (Expired, Revoked, Released), no later response (by send time) shows it Pending or
/// Granted again, and once it showed Granted, none shows it Pending.
pub(super) fn check_claim_phases(events: &[Event], v: &mut Verdict) {
    let mut responses: BTreeMap<&str, Vec<(u64, &str)>> = BTreeMap::new();
    for e in events {
        if let Event::Renewal {
            claim_uid,
            send_ns,
            status,
            phase,
            ..
        } = e
            && (200..300).contains(status)
            && !phase.is_empty()
        {
            responses
                .entry(claim_uid)
                .or_default()
                .push((*send_ns, phase));
        }
    }
    let rank = |phase: &str| match phase {
        "Pending" => 0,
        "Granted" => 1,
        _ => 2,
    };
    for (claim, mut seen) in responses {
        seen.sort();
        for pair in seen.windows(2) {
            let ((_, before), (at, after)) = (pair[0], pair[1]);
            if rank(after) < rank(before) || (rank(before) == 2 && after != before) {
                v.violations.push(format!(
                    "claim {claim}: its phase went back from {before} to {after} (renewal sent at \
                     {} ms)",
                    at / 1_000_000
                ));
                break;
            }
        }
    }
}

/// After `Healed`, each Lease (any of its slots) gets a new holder within the stated
/// bound.
pub(super) fn check_liveness(events: &[Event], expect: &Expectations, v: &mut Verdict) {
    let Some(healed) = events.iter().find_map(|e| match e {
        Event::Healed { t_ns } => Some(*t_ns),
        _ => None,
    }) else {
        v.violations
            .push("the run never healed (no Healed event): liveness unchecked".into());
        return;
    };
    for lease in expect.leases.iter().map(|l| &l.name) {
        let first = events
            .iter()
            .filter_map(|e| match e {
                Event::Grant { lease: l, t_ns, .. } if l == lease && *t_ns > healed => Some(*t_ns),
                _ => None,
            })
            .min();
        match first {
            Some(t) if t - healed <= expect.liveness_ns => {
                v.recovery_ms
                    .insert(lease.clone(), (t - healed) / 1_000_000);
            }
            Some(t) => v.violations.push(format!(
                "lease {lease}: granted again only {} ms after the faults stopped (bound {} ms)",
                (t - healed) / 1_000_000,
                expect.liveness_ns / 1_000_000
            )),
            None => v.violations.push(format!(
                "lease {lease}: not granted again after the faults stopped (bound {} ms)",
                expect.liveness_ns / 1_000_000
            )),
        }
    }
}

/// The timing contract: the controller never ends a grant while its holder's last
/// successful renewal is within the holder's own deadline (workers have no pods, so
/// their pods never go away). A renewal (or the claim's create, or a waiter's early
/// confirmation: a grant is believed from the latest of these sent before it, DESIGN.md
/// "Client deadlines", so each counts whether it came before the grant or after) is
/// successful when it got a 2xx response in which the claim had not ended, within the
/// holder's deadline; the holder then believes it holds its slot until send time +
/// `holder_deadline_ns`. An ending is the first version of the slot (in resourceVersion
/// order) that names another holder or none, at the time the harness's watch saw it:
/// no earlier than the controller's write, so a violation found this way is certain.
/// Grants whose worker deleted its claim (released) before that are left out.
pub(super) fn check_renewal_contract(events: &[Event], expect: &Expectations, v: &mut Verdict) {
    let beliefs = Beliefs::of(events, expect);
    let mut versions: BTreeMap<SlotOf, Vec<(u64, &str, u64)>> = BTreeMap::new();
    for e in events {
        if let Event::LeaseSeen {
            lease,
            slot,
            rv,
            holder_uid,
            t_ns,
            ..
        } = e
        {
            versions
                .entry((lease, *slot))
                .or_default()
                .push((*rv, holder_uid, *t_ns));
        }
    }
    for ((lease, slot), mut seen) in versions {
        seen.sort_by_key(|(rv, _, _)| *rv);
        seen.dedup_by_key(|(rv, _, _)| *rv);
        for pair in seen.windows(2) {
            let ((_, held, _), (rv, next, t_obs)) = (pair[0], pair[1]);
            if held.is_empty() || held == next {
                continue;
            }
            if beliefs.released.get(held).is_some_and(|t| *t <= t_obs) {
                continue;
            }
            if let Some((until, sent)) = beliefs.latest.get(held)
                && *until > t_obs
            {
                v.violations.push(format!(
                    "lease {}: the grant of claim {held} ended (seen at rv {rv}) {} ms \
                     before its holder's deadline: a renewal sent {} ms before the ending \
                     had succeeded",
                    slot_key(lease, slot),
                    (until - t_obs) / 1_000_000,
                    t_obs.saturating_sub(*sent) / 1_000_000
                ));
            }
        }
    }
}

/// What the holders believed, from their renewals (see [`check_renewal_contract`]).
struct Beliefs<'a> {
    /// Per claim: each successful renewal's (response, send time + deadline), the span
    /// in which its holder knew of it and believed it.
    spans: HashMap<&'a str, Vec<(u64, u64)>>,
    /// Per claim: the latest deadline and the send time of the renewal that set it.
    latest: HashMap<&'a str, (u64, u64)>,
    /// Per claim: when its worker first sent the claim's deletion.
    released: HashMap<&'a str, u64>,
}

impl<'a> Beliefs<'a> {
    fn of(events: &'a [Event], expect: &Expectations) -> Self {
        let mut beliefs = Beliefs {
            spans: HashMap::new(),
            latest: HashMap::new(),
            released: HashMap::new(),
        };
        let deadline = expect.holder_deadline_ns;
        for e in events {
            match e {
                Event::Renewal {
                    claim_uid,
                    send_ns,
                    end_ns,
                    status,
                    phase,
                    ..
                } if (200..300).contains(status)
                    && !matches!(phase.as_str(), "Expired" | "Revoked" | "Released")
                    && *end_ns < send_ns + deadline =>
                {
                    let until = send_ns + deadline;
                    beliefs
                        .spans
                        .entry(claim_uid)
                        .or_default()
                        .push((*end_ns, until));
                    let latest = beliefs.latest.entry(claim_uid).or_insert((until, *send_ns));
                    if until > latest.0 {
                        *latest = (until, *send_ns);
                    }
                }
                Event::Release {
                    claim_uid, t_ns, ..
                } => {
                    let first = beliefs.released.entry(claim_uid).or_insert(*t_ns);
                    *first = (*first).min(*t_ns);
                }
                _ => {}
            }
        }
        beliefs
    }

    /// When claim `uid`, granted at `granted_ns`, believed it held its grant: from
    /// the grant (or a renewal's answer after it) to a renewal's deadline, until its
    /// release, merged.
    fn believed(&self, uid: &str, granted_ns: u64) -> Vec<(u64, u64)> {
        let end = self.released.get(uid).copied().unwrap_or(u64::MAX);
        let mut spans: Vec<(u64, u64)> = self
            .spans
            .get(uid)
            .into_iter()
            .flatten()
            .map(|(from, until)| ((*from).max(granted_ns), (*until).min(end)))
            .filter(|(from, until)| from < until)
            .collect();
        spans.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::new();
        for (from, until) in spans {
            match merged.last_mut() {
                Some(last) if from <= last.1 => last.1 = last.1.max(until),
                _ => merged.push((from, until)),
            }
        }
        merged
    }
}

/// At most `permits` holders per Lease at once, two ways: no version of the Lease
/// names more holders than its permits (nor a claim in two slots), and no more than
/// that many holders believed they held it at any instant (by their renewals, as the
/// timing contract has them believe; the agent workers' renewals are their agents',
/// not recorded, so only the library's workers count). Records the most holders a
/// version named, per Lease.
pub(super) fn check_holders_within_permits(
    events: &[Event],
    expect: &Expectations,
    v: &mut Verdict,
) {
    let permits = |lease: &str| {
        expect
            .leases
            .iter()
            .find(|l| l.name == lease)
            .map_or(1, |l| l.permits.max(1) as usize)
    };
    let mut named: BTreeMap<(&str, u64), Vec<(i32, &str)>> = BTreeMap::new();
    for e in events {
        if let Event::LeaseSeen {
            lease,
            slot,
            rv,
            holder_uid,
            ..
        } = e
            && !holder_uid.is_empty()
        {
            named
                .entry((lease, *rv))
                .or_default()
                .push((*slot, holder_uid));
        }
    }
    for ((lease, rv), mut holders) in named {
        holders.sort_unstable();
        holders.dedup();
        let claims: BTreeSet<&str> = holders.iter().map(|(_, uid)| *uid).collect();
        let most = v.most_held.entry(lease.to_string()).or_default();
        *most = (*most).max(claims.len());
        if holders.len() > permits(lease) || claims.len() < holders.len() {
            v.violations.push(format!(
                "lease {lease}: version {rv} names {} holders in {} slots (permits {}): {holders:?}",
                claims.len(),
                holders.len(),
                permits(lease)
            ));
        }
    }
    check_believed_holders(events, expect, &permits, v);
}

/// No more holders believed they held a Lease at once than its permits (see
/// [`check_holders_within_permits`]): the first instant each Lease had too many.
fn check_believed_holders(
    events: &[Event],
    expect: &Expectations,
    permits: &dyn Fn(&str) -> usize,
    v: &mut Verdict,
) {
    let beliefs = Beliefs::of(events, expect);
    // Per Lease: (instant, +1 from / -1 until, claim); ends sort before starts.
    let mut edges: BTreeMap<&str, Vec<(u64, i8, &str)>> = BTreeMap::new();
    for e in events {
        if let Event::Grant {
            lease,
            claim_uid,
            t_ns,
            ..
        } = e
        {
            for (from, until) in beliefs.believed(claim_uid, *t_ns) {
                let lease_edges = edges.entry(lease).or_default();
                lease_edges.push((from, 1, claim_uid));
                lease_edges.push((until, -1, claim_uid));
            }
        }
    }
    for (lease, mut lease_edges) in edges {
        lease_edges.sort_unstable();
        let mut believing: BTreeSet<&str> = BTreeSet::new();
        for (at, edge, claim) in lease_edges {
            if edge < 0 {
                believing.remove(claim);
                continue;
            }
            believing.insert(claim);
            if believing.len() > permits(lease) {
                v.violations.push(format!(
                    "lease {lease}: {} holders believed they held it at once (permits {}) at \
                     {} ms: claims {believing:?}",
                    believing.len(),
                    permits(lease),
                    at / 1_000_000
                ));
                break;
            }
        }
    }
}
