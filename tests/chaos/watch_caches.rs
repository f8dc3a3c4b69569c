//! What the HA plane adds to the checker: the Leases as the harness's watches saw
//! them through each API server. Each server's watch cache may lag the other's, but
//! no server may show the past as the present:
//!
//! - through one server, a Lease's resourceVersion never goes back;
//! - a Lease seen through one server never shows a token lower than one already seen
//!   through the other at the same or an older resourceVersion (a server that claims
//!   to be as fresh must show at least that token);
//! - the object fence's Lease check is judged on what each server has seen (docs/fences.md,
//!   "Why the policy is built this way"): no server accepts a write to a fenced ConfigMap with a
//!   token below a grant it showed the harness [`SIGHT_MARGIN`] before the write was
//!   sent. (Its admission informer and the harness's watch are fed by the same watch
//!   cache; the margin covers their delivery apart on a loaded machine.)
//!
//! And what it measures: how far behind one server showed a version the other had
//! shown first (the watch caches' lag, worst case and 99th percentile).

use std::collections::BTreeMap;

use crate::history::{Event, Outcome, slot_key};

/// How long after a server showed the harness a grant its admission may still judge
/// by the previous one.
pub const SIGHT_MARGIN_NS: u64 = 2_000_000_000;

/// One observation: when, through which server, which version, which token.
#[derive(Clone, Copy)]
struct Seen {
    t_ns: u64,
    server: u8,
    rv: u64,
    token: u64,
}

/// The watch caches' lag: the time between the first and the last server first
/// showing the same version of a Lease, over every version both showed.
#[derive(Debug, Default, Clone, Copy)]
pub struct CacheLag {
    pub versions: usize,
    pub p99_ms: u64,
    pub max_ms: u64,
}

/// Adds a violation for each break of the rules above; returns the lag.
pub fn check(events: &[Event], violations: &mut Vec<String>) -> CacheLag {
    // Per slot of a Lease: a semaphore's slots each have their own tokens.
    let mut by_lease: BTreeMap<(&str, i32), Vec<Seen>> = BTreeMap::new();
    for e in events {
        if let Event::LeaseSeen {
            lease,
            slot,
            rv,
            token,
            t_ns,
            server: Some(server),
            ..
        } = e
        {
            by_lease.entry((lease, *slot)).or_default().push(Seen {
                t_ns: *t_ns,
                server: *server,
                rv: *rv,
                token: *token,
            });
        }
    }
    let mut lags = Vec::new();
    for ((lease, slot), seen) in by_lease.iter_mut() {
        seen.sort_by_key(|s| s.t_ns);
        let key = slot_key(lease, *slot);
        never_back_in_time(&key, seen, violations);
        no_lower_token_at_a_fresher_version(&key, seen, violations);
        // Every version shows slot 0: its lag, once.
        if *slot == 0 {
            lags.extend(lags_of(seen));
        }
    }
    no_stale_write_past_a_servers_sight(events, &by_lease, violations);
    lags.sort_unstable();
    CacheLag {
        versions: lags.len(),
        p99_ms: lags
            .get((lags.len() * 99 / 100).min(lags.len().saturating_sub(1)))
            .map_or(0, |ns| ns / 1_000_000),
        max_ms: lags.last().map_or(0, |ns| ns / 1_000_000),
    }
}

fn never_back_in_time(lease: &str, seen: &[Seen], violations: &mut Vec<String>) {
    let mut newest: BTreeMap<u8, u64> = BTreeMap::new();
    for s in seen {
        let last = newest.entry(s.server).or_default();
        if s.rv < *last {
            violations.push(format!(
                "lease {lease}: kube-apiserver-{} showed rv {} after it had shown rv {last}",
                s.server, s.rv
            ));
        }
        *last = (*last).max(s.rv);
    }
}

fn no_lower_token_at_a_fresher_version(lease: &str, seen: &[Seen], violations: &mut Vec<String>) {
    for (k, later) in seen.iter().enumerate() {
        let earlier = seen[..k]
            .iter()
            .filter(|e| e.server != later.server && e.rv <= later.rv && e.token > later.token)
            .max_by_key(|e| e.token);
        if let Some(e) = earlier {
            violations.push(format!(
                "lease {lease}: kube-apiserver-{} showed token {} at rv {} after \
                 kube-apiserver-{} had shown token {} at rv {}",
                later.server, later.token, later.rv, e.server, e.token, e.rv
            ));
        }
    }
}

/// For each version shown by more than one server: the last server's first showing
/// minus the first server's (a relist showing an unchanged version again is not lag).
/// A fenced ConfigMap write accepted through a server (the one its worker is pinned
/// to) must not carry a token below a grant that server had shown the harness
/// [`SIGHT_MARGIN_NS`] before the write was sent.
fn no_stale_write_past_a_servers_sight(
    events: &[Event],
    by_lease: &BTreeMap<(&str, i32), Vec<Seen>>,
    violations: &mut Vec<String>,
) {
    let pins: BTreeMap<&str, u8> = events
        .iter()
        .filter_map(|e| match e {
            Event::Pinned { worker, server } => Some((worker.as_str(), *server)),
            _ => None,
        })
        .collect();
    for e in events {
        let Event::Write {
            worker,
            lease,
            slot,
            store,
            token,
            seq,
            start_ns,
            outcome: Outcome::Accepted,
            ..
        } = e
        else {
            continue;
        };
        let Some(&server) = pins.get(worker.as_str()) else {
            continue;
        };
        let newer = by_lease
            .get(&(lease.as_str(), *slot))
            .and_then(|seen| seen.iter().find(|s| s.server == server && s.token > *token));
        if store == "configmap"
            && let Some(newer) = newer
            && newer.t_ns + SIGHT_MARGIN_NS < *start_ns
        {
            violations.push(format!(
                "configmap of {}: write {seq} of {worker} with token {token} accepted \
                 through kube-apiserver-{server} {} ms after that server showed token {}",
                slot_key(lease, *slot),
                (start_ns - newer.t_ns) / 1_000_000,
                newer.token
            ));
        }
    }
}

fn lags_of(seen: &[Seen]) -> Vec<u64> {
    let mut first: BTreeMap<u64, BTreeMap<u8, u64>> = BTreeMap::new();
    for s in seen {
        first
            .entry(s.rv)
            .or_default()
            .entry(s.server)
            .or_insert(s.t_ns);
    }
    first
        .values()
        .filter(|by_server| by_server.len() > 1)
        .map(|by_server| {
            let times = by_server.values();
            times.clone().max().unwrap_or(&0) - times.min().unwrap_or(&0)
        })
        .collect()
}

/// Planted violations the rules must report, and a clean history they must not:
/// how many were planted.
pub fn self_check() -> Result<usize, String> {
    let seen_slot = |slot: i32, t_ns: u64, server: u8, rv: u64, token: u64| Event::LeaseSeen {
        lease: "l".into(),
        slot,
        rv,
        holder_uid: format!("u{token}"),
        token,
        t_ns,
        server: Some(server),
    };
    let seen = |t_ns, server, rv, token| seen_slot(0, t_ns, server, rv, token);
    // Server 1 lags server 0 by 5 ns: clean, and the lag is measured.
    // Server 0 shows version 200 again in a relist, 5 s later: not lag.
    // Slot 1's token is above slot 0's, at the same versions: no slot's token went down.
    let clean = vec![
        seen(10, 0, 100, 1),
        seen_slot(1, 10, 0, 100, 3),
        seen(15, 1, 100, 1),
        seen_slot(1, 15, 1, 100, 3),
        seen(20, 0, 200, 2),
        seen(25, 1, 200, 2),
        seen(5_000_000_025, 0, 200, 2),
    ];
    let mut v = Vec::new();
    let lag = check(&clean, &mut v);
    if !v.is_empty() || lag.versions != 2 || lag.max_ms >= 1000 {
        return Err(format!("a clean history was judged {v:?}, lag {lag:?}"));
    }
    // Worker a, pinned to server 0, writes with token 1 after server 0 showed token 2.
    let pinned = || Event::Pinned {
        worker: "a".into(),
        server: 0,
    };
    let write_slot = |slot: i32, start_ns: u64| Event::Write {
        worker: "a".into(),
        lease: "l".into(),
        slot,
        store: "configmap".into(),
        token: 1,
        seq: 1,
        start_ns,
        end_ns: start_ns + 5,
        outcome: Outcome::Accepted,
        rv: Some(start_ns),
        detail: String::new(),
    };
    let write = |start_ns| write_slot(0, start_ns);
    // Within the margin; and a write of slot 1 after slot 0's newer grant.
    let within_sight = vec![
        pinned(),
        seen(10, 0, 200, 2),
        seen(15, 1, 200, 2),
        write(10 + SIGHT_MARGIN_NS),
        write_slot(1, 11 + SIGHT_MARGIN_NS),
    ];
    let mut v = Vec::new();
    check(&within_sight, &mut v);
    if !v.is_empty() {
        return Err(format!(
            "a write within the margin of its server's sight was judged {v:?}"
        ));
    }
    let planted: [(&str, Vec<Event>); 4] = [
        (
            "a server going back in time",
            vec![seen(10, 0, 200, 2), seen(20, 0, 100, 1)],
        ),
        (
            "a lower token at a fresher version",
            vec![seen(10, 0, 200, 2), seen(20, 1, 300, 1)],
        ),
        (
            "a stale write accepted by a server that had seen the newer grant",
            vec![pinned(), seen(10, 0, 200, 2), write(11 + SIGHT_MARGIN_NS)],
        ),
        (
            "a lower token of a slot at a fresher version",
            vec![seen_slot(1, 10, 0, 200, 5), seen_slot(1, 20, 1, 300, 4)],
        ),
    ];
    for (what, events) in &planted {
        let mut v = Vec::new();
        check(events, &mut v);
        if v.is_empty() {
            return Err(format!("{what} was not reported"));
        }
    }
    Ok(planted.len())
}
