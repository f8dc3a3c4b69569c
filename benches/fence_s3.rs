//! The cost of the object-store fence (`cargo bench --bench fence_s3 -- [--rounds N]
//! [--out DIR]`): a fenced write (`S3Fence::put`: HEAD, then a conditional PUT)
//! against a plain PUT of the same bytes, on the same server in the same run. A program
//! that prints figures, not a test. Needs SeaweedFS of `make objectstores` (endpoint
//! PALISADE_TEST_S3, credentials AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, the
//! Makefile's defaults otherwise). Writes `DIR/fence-s3.json` in the schema of
//! benches/common/schema.rs.
//!
//! How: N rounds, each one plain PUT and one fenced write of 1 KiB, in alternating
//! order, on one client, rising tokens (the fence always admits: the common case).
//! The added latency is the median of the per-round differences (fenced - plain), so
//! drift on a shared machine cancels out; p50 and p99 of each kind beside it.

#[path = "common/schema.rs"]
#[allow(dead_code)]
mod schema;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use bytes::Bytes;
use palisade::fence::s3::{Condition, S3Config, S3Fence};
use schema::{Figure, Source, nearest_rank};

/// The object-store fence's added latency (`make bench`).
#[derive(clap::Parser)]
struct Args {
    /// Rounds, each one plain PUT and one fenced write.
    #[arg(long, default_value_t = 300)]
    rounds: usize,
    /// Bytes of each write's payload.
    #[arg(long, default_value_t = 1024)]
    body_bytes: usize,
    /// Where fence-s3.json goes.
    #[arg(long, default_value = "target/bench")]
    out: PathBuf,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

const WARM_UP: usize = 20;
const BUCKET: &str = "palisade-bench";

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn quantile(v: &[f64], q: f64) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    nearest_rank(&s, q)
}

fn config() -> S3Config {
    let env = |name: &str, default: &str| std::env::var(name).unwrap_or_else(|_| default.into());
    S3Config {
        endpoint: env("PALISADE_TEST_S3", "http://127.0.0.1:18333"),
        region: env("AWS_REGION", "us-east-1"),
        bucket: BUCKET.into(),
        access_key_id: env("AWS_ACCESS_KEY_ID", "palisade-test"),
        secret_access_key: env("AWS_SECRET_ACCESS_KEY", "palisade-test-secret"),
        session_token: None,
        path_style: true,
        timeout: Duration::from_secs(10),
        max_attempts: 16,
    }
}

/// Per round: (plain PUT ms, fenced write ms).
async fn rounds(
    fence: &S3Fence,
    rounds: usize,
    body_bytes: usize,
) -> Result<(Vec<f64>, Vec<f64>), String> {
    let run = format!(
        "bench/{}-{}",
        std::process::id(),
        ms(Instant::now().elapsed())
    );
    let (plain_key, fenced_key) = (format!("{run}/plain"), format!("{run}/fenced"));
    let payload = vec![b'x'; body_bytes];
    let (mut plain, mut fenced) = (Vec::new(), Vec::new());
    for round in 0..rounds + WARM_UP {
        {
            let fenced_first = round % 2 == 0;
            for is_fenced in [fenced_first, !fenced_first] {
                let start = Instant::now();
                if is_fenced {
                    fence
                        .put(&fenced_key, round as u64, payload.clone())
                        .await
                        .map_err(|e| format!("fenced write: {e}"))?;
                } else {
                    let reply = fence
                        .client()
                        .put(
                            &plain_key,
                            Bytes::from(payload.clone()),
                            &Condition::None,
                            &[],
                        )
                        .await
                        .map_err(|e| format!("plain PUT: {e}"))?;
                    if !reply.status.is_success() {
                        return Err(format!("plain PUT: {}", reply.describe()));
                    }
                }
                if round >= WARM_UP {
                    if is_fenced { &mut fenced } else { &mut plain }.push(ms(start.elapsed()));
                }
            }
        }
    }
    for key in [plain_key, fenced_key] {
        let _ = fence.client().delete(&key).await;
    }
    Ok((plain, fenced))
}

fn figures(plain: &[f64], fenced: &[f64], note: &str) -> Vec<Figure> {
    let added: Vec<f64> = fenced.iter().zip(plain).map(|(f, p)| f - p).collect();
    let fig = |name: &str, value: f64| Figure {
        system: "s3-seaweedfs".into(),
        config: String::new(),
        name: name.into(),
        value,
        unit: "ms".into(),
        note: note.into(),
    };
    vec![
        fig("fence_added_latency_p50", quantile(&added, 0.5)),
        fig("write_without_fence_p50", quantile(plain, 0.5)),
        fig("write_with_fence_p50", quantile(fenced, 0.5)),
        fig("write_without_fence_p99", quantile(plain, 0.99)),
        fig("write_with_fence_p99", quantile(fenced, 0.99)),
    ]
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args = <Args as clap::Parser>::parse();
    if args.rounds == 0 {
        eprintln!("fence-s3: --rounds must be at least 1");
        return ExitCode::from(2);
    }
    let mut source = Source {
        source: "fence-s3".into(),
        ..Source::default()
    };
    source.versions = schema::palisade_versions(None);
    source
        .parameters
        .insert("rounds".into(), serde_json::json!(args.rounds));
    source
        .parameters
        .insert("body_bytes".into(), serde_json::json!(args.body_bytes));
    let measured = async {
        let fence = S3Fence::new(&config()).map_err(|e| e.to_string())?;
        let made = fence
            .client()
            .create_bucket()
            .await
            .map_err(|e| format!("{e} (run make objectstores)"))?;
        if !made.status.is_success() && made.status.as_u16() != 409 {
            return Err(format!("creating bucket {BUCKET}: {}", made.describe()));
        }
        rounds(&fence, args.rounds, args.body_bytes).await
    };
    let (plain, fenced) = match measured.await {
        Ok(samples) => samples,
        Err(e) => {
            eprintln!("fence-s3: FAILED: {e}");
            return ExitCode::FAILURE;
        }
    };
    let note = "SeaweedFS 4.48 on 127.0.0.1: plain PUT against HEAD + conditional PUT, \
                alternating; added = median of per-round differences";
    source.figures.extend(figures(&plain, &fenced, note));
    for f in &source.figures {
        println!(
            "fence-s3: {:<12} {:<26} {:>8.3} {}",
            f.system, f.name, f.value, f.unit
        );
    }
    let path = source.write_to(&args.out);
    println!("fence-s3: wrote {}", path.display());
    ExitCode::SUCCESS
}
