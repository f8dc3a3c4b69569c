//! `palisade fence check s3://BUCKET/PREFIX`: does this server honour conditional
//! writes, atomically? The fence is only as good as the server's `If-Match` and
//! `If-None-Match` (see [`super`]); S3-compatible servers have shipped with them
//! ignored, or checked apart from the write they guard, so users test their own.
//!
//! On fresh keys under PREFIX (deleted afterwards), it checks:
//!
//! - **conditions**: a wrong `If-Match` and `If-None-Match: *` on an existing key get
//!   412 and leave the object as it was; the right `If-Match` writes. A server that
//!   ignores the conditions fails here.
//! - **racing creates** and **racing updates**: in each round, several writers send
//!   `If-None-Match: *` on a new key, or `If-Match` with the same ETag, at once. At
//!   most one may succeed, and the object must then hold the winner's bytes. A
//!   server that checks the condition and writes in two steps lets several through
//!   when their checks interleave. Each writer holds its last byte until every writer
//!   has sent the rest, so the requests complete at the server together; large bodies
//!   (9 MiB by default) widen the gap between a server's check and its write, which
//!   is where such servers race (moto's server mode spools a body over 5 MiB to disk
//!   in between).
//! - **ETag repeats** (information, not a verdict): whether writing the same bytes
//!   again gives the same ETag (the MD5 of the bytes, as on AWS). The fence's
//!   envelope makes every write's bytes unique, so it is safe either way.
//!
//! Every loop is bounded: rounds, writers, and [`ProbeOptions::time_limit`].

use std::fmt;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::task::JoinSet;

use super::{Condition, Error, S3Client, envelope};

/// The longest a racing writer holds its last byte for the others.
const RELEASE_WAIT: Duration = Duration::from_secs(10);

/// How hard to probe.
#[derive(Debug, Clone)]
pub struct ProbeOptions {
    /// Rounds of each race.
    pub rounds: u32,
    /// Writers racing in each round.
    pub writers: u32,
    /// Bytes each racing writer sends.
    pub body_bytes: usize,
    /// No new round starts after this long.
    pub time_limit: Duration,
}

impl Default for ProbeOptions {
    fn default() -> Self {
        ProbeOptions {
            rounds: 8,
            writers: 8,
            body_bytes: 9 << 20,
            time_limit: Duration::from_secs(120),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Pass,
    Fail,
    /// Information only.
    Info,
}

/// One check's outcome, with the counts behind it.
#[derive(Debug, Clone)]
pub struct CheckResult {
    pub name: &'static str,
    pub verdict: Verdict,
    pub detail: String,
}

/// Every check, in order.
#[derive(Debug, Clone, Default)]
pub struct ProbeReport {
    pub checks: Vec<CheckResult>,
}

impl ProbeReport {
    /// Whether no check failed.
    pub fn passed(&self) -> bool {
        self.checks.iter().all(|c| c.verdict != Verdict::Fail)
    }

    pub fn check(&self, name: &str) -> Option<&CheckResult> {
        self.checks.iter().find(|c| c.name == name)
    }
}

impl fmt::Display for ProbeReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for check in &self.checks {
            let verdict = match check.verdict {
                Verdict::Pass => "PASS",
                Verdict::Fail => "FAIL",
                Verdict::Info => "INFO",
            };
            writeln!(f, "{verdict} {}: {}", check.name, check.detail)?;
        }
        if self.passed() {
            write!(
                f,
                "the server honours conditional writes atomically in these checks"
            )
        } else {
            write!(
                f,
                "the server does NOT honour conditional writes atomically: the object-store \
                 fence is not safe on it"
            )
        }
    }
}

/// Runs every check on fresh keys under `prefix` and deletes them afterwards, whatever
/// the outcome. `Err` only when the probe could not run (no bucket, denied, ...).
pub async fn probe(
    client: &S3Client,
    prefix: &str,
    options: &ProbeOptions,
) -> Result<ProbeReport, Error> {
    let base = match prefix {
        "" => format!("palisade-probe-{}/", envelope::write_id()),
        p if p.ends_with('/') => format!("{p}palisade-probe-{}/", envelope::write_id()),
        p => format!("{p}/palisade-probe-{}/", envelope::write_id()),
    };
    let mut keys = Vec::new();
    let result = run_checks(client, &base, options, &mut keys).await;
    for key in &keys {
        // Best effort: a failed delete must not hide the report.
        let _ = client.delete(key).await;
    }
    result
}

async fn run_checks(
    client: &S3Client,
    base: &str,
    options: &ProbeOptions,
    keys: &mut Vec<String>,
) -> Result<ProbeReport, Error> {
    let mut report = ProbeReport::default();
    let mut key = |name: String| {
        let key = format!("{base}{name}");
        keys.push(key.clone());
        key
    };
    report
        .checks
        .push(conditions(client, &key("conditions".into())).await?);
    let deadline = Instant::now() + options.time_limit;
    let mut create_keys = Vec::new();
    let mut update_keys = Vec::new();
    for round in 0..options.rounds {
        create_keys.push(key(format!("create-{round}")));
        update_keys.push(key(format!("update-{round}")));
    }
    report.checks.push(
        race(
            client,
            "racing creates",
            &create_keys,
            options,
            deadline,
            false,
        )
        .await?,
    );
    report.checks.push(
        race(
            client,
            "racing updates",
            &update_keys,
            options,
            deadline,
            true,
        )
        .await?,
    );
    report
        .checks
        .push(etag_repeats(client, &key("etag-repeat".into())).await?);
    Ok(report)
}

/// A PUT that must succeed for the probe to go on.
async fn put_ok(
    client: &S3Client,
    key: &str,
    body: &[u8],
    condition: &Condition,
) -> Result<Option<String>, Error> {
    let reply = client
        .put(key, Bytes::copy_from_slice(body), condition, &[])
        .await?;
    if reply.status.is_success() {
        return Ok(reply.etag());
    }
    Err(refused("PUT", key, &reply, client))
}

fn refused(what: &'static str, key: &str, reply: &super::Reply, client: &S3Client) -> Error {
    match (reply.status.as_u16(), reply.error_code().as_deref()) {
        (404, Some("NoSuchBucket")) => Error::NoBucket {
            bucket: client.bucket_name().to_owned(),
        },
        (403, _) => Error::Denied {
            bucket: client.bucket_name().to_owned(),
            detail: reply.describe(),
        },
        _ => Error::Unexpected {
            what,
            key: key.to_owned(),
            detail: reply.describe(),
        },
    }
}

/// Wrong preconditions refused with 412 and nothing written; the right one writes.
async fn conditions(client: &S3Client, key: &str) -> Result<CheckResult, Error> {
    let etag = put_ok(client, key, b"palisade probe: base", &Condition::None).await?;
    let wrong = Condition::Matches("\"00000000000000000000000000000000\"".into());
    let wrong_match = client.put(key, Bytes::from_static(b"wrong If-Match"), &wrong, &[]);
    let wrong_match = wrong_match.await?.status.as_u16();
    let exists = client.put(
        key,
        Bytes::from_static(b"If-None-Match"),
        &Condition::Absent,
        &[],
    );
    let exists = exists.await?.status.as_u16();
    let read = client.get(key).await?;
    let unchanged = read.status.is_success() && read.body.as_ref() == b"palisade probe: base";
    let right_match = match etag {
        Some(etag) => {
            let right = Condition::Matches(etag);
            let reply = client.put(key, Bytes::from_static(b"right"), &right, &[]);
            reply.await?.status.as_u16()
        }
        None => 0,
    };
    let passed =
        wrong_match == 412 && exists == 412 && unchanged && (200..300).contains(&right_match);
    Ok(CheckResult {
        name: "conditions",
        verdict: if passed { Verdict::Pass } else { Verdict::Fail },
        detail: format!(
            "wrong If-Match got HTTP {wrong_match}, If-None-Match: * on an existing key got \
             HTTP {exists} (412 expected for both); object {}; the right If-Match got {}",
            if unchanged {
                "unchanged"
            } else {
                "CHANGED or unreadable"
            },
            if right_match == 0 {
                "no ETag to try".to_owned()
            } else {
                format!("HTTP {right_match}")
            }
        ),
    })
}

/// What the rounds of one race found.
#[derive(Debug, Default)]
struct RaceTally {
    rounds: u32,
    one_winner: u32,
    no_winner: u32,
    several_winners: u32,
    most_winners: u32,
    /// Rounds whose object held bytes no winner wrote.
    lost_winner: u32,
    /// Answers other than 2xx, 409 and 412, by status.
    other_statuses: std::collections::BTreeMap<u16, u32>,
}

/// Rounds of `writers` conditional PUTs at once on one key each: `If-None-Match: *`
/// on a new key, or (`update`) `If-Match` with the ETag of a base object.
async fn race(
    client: &S3Client,
    name: &'static str,
    keys: &[String],
    options: &ProbeOptions,
    deadline: Instant,
    update: bool,
) -> Result<CheckResult, Error> {
    let mut tally = RaceTally::default();
    for (round, key) in keys.iter().enumerate() {
        if Instant::now() >= deadline {
            break;
        }
        let condition = if update {
            let etag = put_ok(client, key, b"palisade probe: base", &Condition::None).await?;
            Condition::Matches(etag.ok_or_else(|| Error::Unexpected {
                what: "PUT",
                key: key.clone(),
                detail: "the server gave no ETag".into(),
            })?)
        } else {
            Condition::Absent
        };
        let statuses = race_round(client, key, round, &condition, options).await?;
        let winners: Vec<usize> = (0..statuses.len())
            .filter(|&w| (200..300).contains(&statuses[w]))
            .collect();
        for &status in &statuses {
            if !(200..300).contains(&status) && status != 412 && status != 409 {
                *tally.other_statuses.entry(status).or_default() += 1;
            }
        }
        tally.rounds += 1;
        let count = winners.len() as u32;
        tally.most_winners = tally.most_winners.max(count);
        match count {
            0 => tally.no_winner += 1,
            1 => tally.one_winner += 1,
            _ => tally.several_winners += 1,
        }
        let stored = landed_writer(client, key).await?;
        if count > 0 && !stored.is_some_and(|w| winners.contains(&w)) {
            tally.lost_winner += 1;
        }
    }
    Ok(race_verdict(name, &tally, options))
}

fn race_verdict(name: &'static str, tally: &RaceTally, options: &ProbeOptions) -> CheckResult {
    let passed = tally.rounds > 0 && tally.several_winners == 0 && tally.lost_winner == 0;
    CheckResult {
        name,
        verdict: if passed { Verdict::Pass } else { Verdict::Fail },
        detail: format!(
            "{} rounds of {} writers ({} KiB each): {} with exactly one winner, {} with \
             several (at most {} at once), {} with none; {} rounds stored bytes no winner \
             wrote; answers other than 2xx/409/412: {}",
            tally.rounds,
            options.writers,
            options.body_bytes >> 10,
            tally.one_winner,
            tally.several_winners,
            tally.most_winners,
            tally.no_winner,
            tally.lost_winner,
            if tally.other_statuses.is_empty() {
                "none".to_owned()
            } else {
                let counts = tally.other_statuses.iter();
                let counts: Vec<String> = counts.map(|(s, n)| format!("{n} x HTTP {s}")).collect();
                counts.join(", ")
            },
        ),
    }
}

/// One round: every writer's PUT at once; their statuses, by writer.
async fn race_round(
    client: &S3Client,
    key: &str,
    round: usize,
    condition: &Condition,
    options: &ProbeOptions,
) -> Result<Vec<u16>, Error> {
    let mut writers = JoinSet::new();
    // Every writer holds its last byte until all have sent the rest: the requests
    // complete at the server together, whatever the client's scheduling.
    let all_sent = std::sync::Arc::new(tokio::sync::Barrier::new(options.writers as usize));
    for writer in 0..options.writers as usize {
        let mut body = format!("palisade probe round={round} writer={writer}\n").into_bytes();
        body.resize(options.body_bytes.max(body.len()), b'.');
        let (client, key, condition) = (client.clone(), key.to_owned(), condition.clone());
        let all_sent = all_sent.clone();
        // Bounded: a writer the server answered early never reaches the barrier.
        let release = async move {
            let _ = tokio::time::timeout(RELEASE_WAIT, all_sent.wait()).await;
        };
        writers.spawn(async move {
            let reply = client
                .put_held(&key, Bytes::from(body), &condition, release)
                .await;
            (writer, reply.map(|r| r.status.as_u16()))
        });
    }
    let mut statuses = vec![0; options.writers as usize];
    while let Some(joined) = writers.join_next().await {
        let (writer, status) = joined.map_err(|e| Error::Http {
            what: "PUT (racing writer)".into(),
            source: Box::new(e),
        })?;
        statuses[writer] = status?;
    }
    Ok(statuses)
}

/// Which writer's bytes the object holds, from its first line.
async fn landed_writer(client: &S3Client, key: &str) -> Result<Option<usize>, Error> {
    let reply = client.get(key).await?;
    if !reply.status.is_success() {
        return Ok(None);
    }
    let head = &reply.body[..reply.body.len().min(80)];
    let text = String::from_utf8_lossy(head);
    Ok(text
        .lines()
        .next()
        .and_then(|line| line.rsplit_once("writer="))
        .and_then(|(_, w)| w.parse().ok()))
}

/// Whether the same bytes written again get the same ETag (A, B, then A again).
async fn etag_repeats(client: &S3Client, key: &str) -> Result<CheckResult, Error> {
    let first = put_ok(client, key, b"palisade probe: A", &Condition::None).await?;
    put_ok(client, key, b"palisade probe: B", &Condition::None).await?;
    let again = put_ok(client, key, b"palisade probe: A", &Condition::None).await?;
    let repeats = first.is_some() && first == again;
    Ok(CheckResult {
        name: "etag repeats",
        verdict: Verdict::Info,
        detail: if repeats {
            format!(
                "the same bytes written again got the same ETag ({}): an If-Match alone \
                 could match a newer object; the fence's envelope makes every write's \
                 bytes, and so its ETag, unique",
                first.unwrap_or_default()
            )
        } else {
            "the same bytes written again got a new ETag".to_owned()
        },
    })
}
