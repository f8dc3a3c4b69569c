//! The example workload (examples/ledger): its manifest, the fenced ConfigMap's
//! history as a watch sees it, and the Lease its pods take turns holding.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{Api, Client};
use palisade::crd::Lease;

use crate::LEDGER_NS;

/// examples/ledger/ledger.yaml with its writer image replaced by `image`.
pub fn ledger_example(image: &str) -> String {
    let path = support::repo_root().join("examples/ledger/ledger.yaml");
    let yaml = std::fs::read_to_string(&path).unwrap();
    let mut replaced = 0;
    let out: Vec<String> = yaml
        .lines()
        .map(|l| match l.split_once("image: ") {
            Some((indent, old)) if old.contains("/palisade-example") => {
                replaced += 1;
                format!("{indent}image: {image}")
            }
            _ => l.to_string(),
        })
        .collect();
    assert_eq!(
        replaced,
        1,
        "{}: expected one palisade-example image",
        path.display()
    );
    out.join("\n")
}

/// One version of the fenced ConfigMap, as the watch saw it.
#[derive(Debug, Clone)]
pub struct Write {
    pub token: u64,
    holder: String,
    phase: String,
}

pub fn record(history: &Arc<Mutex<Vec<Write>>>, cm: &ConfigMap) {
    let data = cm.data.clone().unwrap_or_default();
    let token = data.get("token").and_then(|t| t.parse().ok()).unwrap_or(0);
    if token == 0 {
        return;
    }
    let w = Write {
        token,
        holder: data.get("holder").cloned().unwrap_or_default(),
        phase: data.get("phase").cloned().unwrap_or_default(),
    };
    let mut h = history.lock().unwrap();
    let last = h.last();
    if last.is_none_or(|l| l.token != w.token || l.phase != w.phase) {
        h.push(w);
    }
}

/// The history's invariants: tokens never decrease; a token belongs to one holder; a
/// critical section (enter..exit of one token) is never interleaved with another token.
pub fn check_history(history: &[Write]) {
    let mut open: Option<u64> = None;
    let mut owner = std::collections::BTreeMap::new();
    for (i, w) in history.iter().enumerate() {
        if i > 0 {
            assert!(
                w.token >= history[i - 1].token,
                "token went down at write {i}: {history:#?}"
            );
        }
        let prev = owner.entry(w.token).or_insert_with(|| w.holder.clone());
        assert_eq!(
            *prev, w.holder,
            "token {} written by two pods: {history:#?}",
            w.token
        );
        match w.phase.as_str() {
            "enter" => open = Some(w.token),
            "exit" => {
                if let Some(t) = open {
                    assert_eq!(
                        t, w.token,
                        "exit of {} inside the section of {t}: {history:#?}",
                        w.token
                    );
                }
                open = None;
            }
            other => panic!("unexpected phase {other:?}"),
        }
    }
}

pub fn sections(history: &Arc<Mutex<Vec<Write>>>) -> usize {
    history
        .lock()
        .unwrap()
        .iter()
        .filter(|w| w.phase == "exit")
        .count()
}

pub fn max_token(history: &Arc<Mutex<Vec<Write>>>) -> u64 {
    history
        .lock()
        .unwrap()
        .iter()
        .map(|w| w.token)
        .max()
        .unwrap_or(0)
}

pub async fn lease(client: &Client) -> Lease {
    Api::<Lease>::namespaced(client.clone(), LEDGER_NS)
        .get("ledger")
        .await
        .unwrap()
}

pub fn holder_of(l: &Lease) -> Option<(String, i64)> {
    let s = l.status.as_ref()?;
    Some((s.holder.as_ref()?.identity.clone(), s.fencing_token?))
}

/// Waits for a grant to a holder other than `old` and returns it with the time it took.
pub async fn next_grant(
    client: &Client,
    old: &str,
    since: Instant,
    limit: Duration,
) -> (String, i64, Duration) {
    let deadline = since + limit;
    loop {
        if let Some((h, t)) = holder_of(&lease(client).await)
            && h != old
        {
            return (h, t, since.elapsed());
        }
        assert!(
            Instant::now() < deadline,
            "no grant to another pod within {limit:?} of deleting {old}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
