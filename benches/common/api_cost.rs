//! The API cost of one palisade Lease (`benches/handover.rs`): requests/s at steady
//! state with its holder alone, then with one holder and three waiters, as the API
//! server counts them and as the candidates' own client does.

use std::time::{Duration, Instant};

use kube::{Client, Config};
use palisade::client::{AcquireOptions, LeaseClient, PodBinding};
use support::requests;

use crate::cluster::wait_waiting;
use crate::schema::Figure;

/// The lease duration of the API-cost Lease, client-go's default.
pub const STEADY_LEASE_SECS: i64 = 15;
/// An idle rate of palisade.dev requests above this (req/s) means someone else uses the cluster.
const NOT_IDLE: f64 = 1.0;

fn options(identity: &str) -> AcquireOptions {
    AcquireOptions {
        identity: Some(identity.to_string()),
        pod: PodBinding::None,
        timeout: Some(Duration::from_secs(30)),
        slot: None,
    }
}

/// Requests/s of one phase of the API cost: what the API server counted over the
/// window, plus the restarts of the candidates' open watches pro rata (a watch is
/// counted when it ends, every `timeoutSeconds`, which no window of seconds sees).
pub struct Rate {
    /// apiserver_request_total's rate over the window.
    counted: f64,
    window: f64,
    /// The candidates' watches open at the window's end, each restarting once per
    /// its `timeoutSeconds`: their restarts per second (and how many watches).
    restarts: f64,
    watches: usize,
    /// Requests/s the candidates sent, counted in their client.
    client_side: f64,
}

pub struct Cost {
    idle: Rate,
    holder: Rate,
    all: Rate,
}

impl Cost {
    /// A phase's rate less the idle one, plus its watches' restarts.
    fn rate(&self, r: &Rate) -> f64 {
        r.counted - self.idle.counted + r.restarts
    }

    fn client_side(&self, r: &Rate) -> f64 {
        r.client_side + r.restarts
    }
}

/// The rate of [`palisade_requests`](crate::cluster::palisade_requests) over `window` seconds, the candidates' requests
/// counted in `sent`, and their watches' restarts pro rata.
async fn request_rate(client: &Client, sent: &requests::Recorded, window: f64) -> Rate {
    let before = crate::cluster::palisade_requests(client).await;
    let sent_before = palisade_requests_sent(sent);
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_secs_f64(window)).await;
    let after = crate::cluster::palisade_requests(client).await;
    let elapsed = t0.elapsed().as_secs_f64();
    let periods = watch_periods(sent);
    Rate {
        counted: (after - before) / elapsed,
        window: elapsed,
        restarts: periods.iter().map(|p| 1.0 / p).sum(),
        watches: periods.len(),
        client_side: (palisade_requests_sent(sent) - sent_before) as f64 / elapsed,
    }
}

/// One Lease (15 s duration): the holder alone, then the holder and three waiters,
/// requests/s at steady state in each.
pub async fn api_cost(
    client: &Client,
    config: Config,
    ns: &str,
    baseline: f64,
    warmup: f64,
    window: f64,
) -> Cost {
    // The holder and the waiters send through a client of their own that counts.
    let sent = requests::Recorded::default();
    let (builder, protocol) = palisade::kube_client::builder(config).unwrap();
    let counted = builder.with_layer(&sent).build();
    let leases = &LeaseClient::on_pinged_connections(counted, protocol, ns);
    let idle = request_rate(client, &sent, baseline).await;
    leases
        .ensure_lease("steady", STEADY_LEASE_SECS)
        .await
        .unwrap();
    let holder = leases
        .acquire("steady", options("steady-holder"))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs_f64(warmup)).await;
    let holder_rate = request_rate(client, &sent, window).await;
    let waiters: Vec<_> = (0..3)
        .map(|i| {
            let l = leases.clone();
            tokio::spawn(async move {
                let mut o = options(&format!("steady-waiter-{i}"));
                o.timeout = None;
                l.acquire("steady", o).await
            })
        })
        .collect();
    wait_waiting(leases, "steady", 3).await;
    tokio::time::sleep(Duration::from_secs_f64(warmup)).await;
    let all = request_rate(client, &sent, window).await;
    assert!(
        holder.lost_reason().is_none(),
        "the steady holder lost its grant"
    );
    // Waiters first (a cancelled acquire deletes its claim), so that nothing is handed over.
    for w in waiters {
        w.abort();
        assert!(
            w.await.is_err_and(|e| e.is_cancelled()),
            "a waiter was granted"
        );
    }
    holder.release().await.unwrap();
    leases.flush(Duration::from_secs(10)).await;
    Cost {
        idle,
        holder: holder_rate,
        all,
    }
}

/// The `timeoutSeconds` of every watch the candidates opened, seconds, each taken
/// as open still: the library's watches last minutes on these connections and a
/// phase is seconds, and one it closed early (an acquire's, once granted) counts
/// 1/timeoutSeconds too many: an upper bound, independent of the library's internals.
fn watch_periods(sent: &requests::Recorded) -> Vec<f64> {
    sent.taken()
        .iter()
        .filter_map(|r| {
            let q = r.split_once('?')?.1;
            if !q.split('&').any(|kv| kv == "watch=true" || kv == "watch=1") {
                return None;
            }
            q.split('&')
                .find_map(|kv| kv.strip_prefix("timeoutSeconds="))?
                .parse::<f64>()
                .ok()
        })
        .collect()
}

/// The API cost's figures: holder alone, per waiter, and 1 holder + 3 waiters, each
/// with its watches' restarts pro rata; the client-side counts beside them.
pub fn cost_figures(c: &Cost) -> Vec<Figure> {
    let figure = |name: &str, value: f64, note: String| Figure {
        system: "palisade".into(),
        config: "default".into(),
        name: name.into(),
        value,
        unit: "req/s".into(),
        note,
    };
    let caution = |r: &Rate| {
        let mut s = String::new();
        if r.counted < c.idle.counted {
            s += "; INVALID: below the idle rate (other traffic fell into the idle window)";
        }
        if c.idle.counted > NOT_IDLE {
            s += "; CAUTION: the cluster was not idle (palisade.dev requests from elsewhere), \
                  so this figure is noise: see the client-side one";
        }
        s
    };
    let method = |r: &Rate| {
        format!(
            "apiserver_request_total{{group=palisade.dev, resource=leases|leaseclaims}}, all verbs \
             (candidates and controller), over a window of {:.0} s at steady state, \
             {STEADY_LEASE_SECS} s lease duration, less the idle rate ({:.3} req/s over {:.0} s), \
             plus the candidates' {} open watches restarting once per their timeoutSeconds, \
             pro rata ({:.4} req/s; every watch they opened taken as open, an upper bound): the counter counts a watch when it ends, which a window \
             this short does not see (counted alone: {:.3} req/s)",
            r.window,
            c.idle.counted,
            c.idle.window,
            r.watches,
            r.restarts,
            r.counted - c.idle.counted
        )
    };
    let per_waiter = (c.rate(&c.all) - c.rate(&c.holder)) / 3.0;
    vec![
        figure(
            "lease_requests_per_s_holder_only",
            c.rate(&c.holder),
            format!(
                "one holder alone on the Lease; {}{}",
                method(&c.holder),
                caution(&c.holder)
            ),
        ),
        figure(
            "lease_requests_per_s_per_waiter",
            per_waiter,
            "(1 holder + 3 waiters less the holder alone) / 3, both as their figures say".into(),
        ),
        figure(
            "lease_requests_per_s_1_holder_3_waiters",
            c.rate(&c.all),
            format!(
                "one holder and three waiters; {}{}",
                method(&c.all),
                caution(&c.all)
            ),
        ),
        figure(
            "lease_requests_per_s_holder_only_client_side",
            c.client_side(&c.holder),
            "requests to leases and leaseclaims the holder sent, counted in its client, plus its \
             watches' restarts pro rata (the controller's are not in it)"
                .into(),
        ),
        figure(
            "lease_requests_per_s_per_waiter_client_side",
            (c.client_side(&c.all) - c.client_side(&c.holder)) / 3.0,
            "(1 holder + 3 waiters less the holder alone) / 3, client-side counts as their \
             figures say"
                .into(),
        ),
        figure(
            "lease_requests_per_s_1_holder_3_waiters_client_side",
            c.client_side(&c.all),
            "requests to leases and leaseclaims sent by the holder and the 3 waiters, counted in \
             their client, plus their watches' restarts pro rata (the controller's are not in it)"
                .into(),
        ),
        figure(
            "idle_requests_per_s",
            c.idle.counted,
            format!(
                "the same counter with the controller running and no claim, over {:.0} s",
                c.idle.window
            ),
        ),
    ]
}

/// How many of the recorded requests went to palisade's resources.
fn palisade_requests_sent(sent: &requests::Recorded) -> usize {
    sent.taken()
        .iter()
        .filter(|r| {
            let path = r.split(' ').nth(1).unwrap_or_default();
            path.starts_with("/apis/palisade.dev/")
                && (path.contains("/leases") || path.contains("/leaseclaims"))
        })
        .count()
}
