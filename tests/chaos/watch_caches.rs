//! What the HA plane adds to the checker: the Leases as the harness's watches saw
//! them through each API server. Each server's watch cache may lag the other's, but
//! no server may show the past as the present:
//!
//! - through one server, a Lease's resourceVersion never goes back;
//! - a Lease seen through one server never shows a token lower than one already seen
//!   through the other at the same or an older resourceVersion (a server that claims
//!   to be as fresh must show at least that token).
//!
//! And what it measures: how far behind one server showed a version the other had
//! shown first (the watch caches' lag, worst case and 99th percentile).

use std::collections::BTreeMap;

use crate::history::Event;

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
    let mut by_lease: BTreeMap<&str, Vec<Seen>> = BTreeMap::new();
    for e in events {
        if let Event::LeaseSeen {
            lease,
            rv,
            token,
            t_ns,
            server: Some(server),
            ..
        } = e
        {
            by_lease.entry(lease).or_default().push(Seen {
                t_ns: *t_ns,
                server: *server,
                rv: *rv,
                token: *token,
            });
        }
    }
    let mut lags = Vec::new();
    for (lease, mut seen) in by_lease {
        seen.sort_by_key(|s| s.t_ns);
        never_back_in_time(lease, &seen, violations);
        no_lower_token_at_a_fresher_version(lease, &seen, violations);
        lags.extend(lags_of(&seen));
    }
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
    let seen = |t_ns: u64, server: u8, rv: u64, token: u64| Event::LeaseSeen {
        lease: "l".into(),
        rv,
        holder_uid: format!("u{token}"),
        token,
        t_ns,
        server: Some(server),
    };
    // Server 1 lags server 0 by 5 ns: clean, and the lag is measured.
    // Server 0 shows version 200 again in a relist, 5 s later: not lag.
    let clean = vec![
        seen(10, 0, 100, 1),
        seen(15, 1, 100, 1),
        seen(20, 0, 200, 2),
        seen(25, 1, 200, 2),
        seen(5_000_000_025, 0, 200, 2),
    ];
    let mut v = Vec::new();
    let lag = check(&clean, &mut v);
    if !v.is_empty() || lag.versions != 2 || lag.max_ms >= 1000 {
        return Err(format!("a clean history was judged {v:?}, lag {lag:?}"));
    }
    let planted: [(&str, Vec<Event>); 2] = [
        (
            "a server going back in time",
            vec![seen(10, 0, 200, 2), seen(20, 0, 100, 1)],
        ),
        (
            "a lower token at a fresher version",
            vec![seen(10, 0, 200, 2), seen(20, 1, 300, 1)],
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
