//! The cost of the fencing check in PostgreSQL and Redis (`cargo bench --bench
//! fence_db -- [--rounds N] [--out DIR]`): the median added latency per transaction
//! of `palisade.fence` (and of the Redis script) against the same write without it.
//! A program that prints figures, not a test. Needs the servers of `make databases`
//! (URLs from PALISADE_TEST_POSTGRES / PALISADE_TEST_REDIS, the Makefile's defaults
//! otherwise). Writes `DIR/fence-db.json` in the schema of benches/common/schema.rs.
//!
//! How: N rounds, each one transaction without the check and one with it, in
//! alternating order, on one connection, one key, rising tokens (the check always
//! passes and raises the mark: the common case). PostgreSQL: `BEGIN; INSERT; COMMIT`
//! against `BEGIN; SELECT palisade.fence; INSERT; COMMIT` at READ COMMITTED with
//! fsync on. Redis: `SET` against the fencing script doing the same `SET`, AOF with
//! `appendfsync always`. The added latency is the median of the per-round
//! differences (with - without), so drift on a shared machine cancels out.

#[path = "common/schema.rs"]
#[allow(dead_code)]
mod schema;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use palisade::fence::postgres as pg_fence;
use palisade::fence::redis::{self as redis_fence, RedisFence, Write};
use schema::{Figure, Source, nearest_rank};

/// The added latency of the fencing check in PostgreSQL and Redis (`make bench`).
#[derive(clap::Parser)]
struct Args {
    /// Rounds, each one transaction without the check and one with it.
    #[arg(long, default_value_t = 300)]
    rounds: usize,
    /// Where fence-db.json goes.
    #[arg(long, default_value = "target/bench")]
    out: PathBuf,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

fn args() -> Result<Args, String> {
    let args = <Args as clap::Parser>::parse();
    if args.rounds == 0 {
        return Err("--rounds must be at least 1".into());
    }
    Ok(args)
}

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    nearest_rank(&s, 0.5)
}

fn figures(system: &str, without: &[f64], with: &[f64], note: &str) -> Vec<Figure> {
    let added: Vec<f64> = with.iter().zip(without).map(|(a, b)| a - b).collect();
    let fig = |name: &str, value: f64| Figure {
        system: system.into(),
        config: String::new(),
        name: name.into(),
        value,
        unit: "ms".into(),
        note: note.into(),
    };
    vec![
        fig("fence_added_latency_p50", median(&added)),
        fig("write_without_fence_p50", median(without)),
        fig("write_with_fence_p50", median(with)),
    ]
}

async fn postgres(rounds: usize) -> Result<(Vec<f64>, Vec<f64>), String> {
    let url = std::env::var("PALISADE_TEST_POSTGRES")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:15432/postgres".into());
    let (mut client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .map_err(|e| format!("connecting to {url}: {e} (run make databases)"))?;
    tokio::spawn(connection);
    pg_fence::install(&client)
        .await
        .map_err(|e| format!("install: {e:?}"))?;
    client
        .batch_execute(
            "CREATE TABLE IF NOT EXISTS public.bench_writes (id bigserial PRIMARY KEY, v bigint)",
        )
        .await
        .map_err(|e| e.to_string())?;
    let key = format!(
        "bench-{}-{}",
        std::process::id(),
        Instant::now().elapsed().as_nanos()
    );
    let insert = client
        .prepare("INSERT INTO public.bench_writes (v) VALUES ($1)")
        .await
        .map_err(|e| e.to_string())?;
    let (mut without, mut with) = (Vec::new(), Vec::new());
    for round in 0..rounds + 20 {
        for fenced in [round % 2 == 0, round % 2 == 1] {
            let start = Instant::now();
            let tx = client.transaction().await.map_err(|e| e.to_string())?;
            if fenced {
                pg_fence::admit(&tx, &key, round as u64)
                    .await
                    .map_err(|e| format!("{e:?}"))?;
            }
            tx.execute(&insert, &[&(round as i64)])
                .await
                .map_err(|e| e.to_string())?;
            tx.commit().await.map_err(|e| e.to_string())?;
            // The first 20 rounds warm up the connection and plans.
            if round >= 20 {
                if fenced { &mut with } else { &mut without }.push(ms(start.elapsed()));
            }
        }
    }
    Ok((without, with))
}

async fn redis(rounds: usize) -> Result<(Vec<f64>, Vec<f64>), String> {
    let url =
        std::env::var("PALISADE_TEST_REDIS").unwrap_or_else(|_| "redis://127.0.0.1:16379/".into());
    let mut conn = redis::Client::open(url.as_str())
        .map_err(|e| e.to_string())?
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| format!("connecting to {url}: {e} (run make databases)"))?;
    let key = format!("bench-{}", std::process::id());
    let value_key = redis_fence::data_key(&key, "value");
    RedisFence::create(&mut conn, &key)
        .await
        .map_err(|e| format!("creating the mark of {key}: {e}"))?;
    let fence = RedisFence::new();
    let (mut without, mut with) = (Vec::new(), Vec::new());
    for round in 0..rounds + 20 {
        let value = round.to_string();
        for fenced in [round % 2 == 0, round % 2 == 1] {
            let start = Instant::now();
            if fenced {
                fence
                    .admit(
                        &mut conn,
                        &key,
                        round as u64,
                        Write::Set {
                            key: &value_key,
                            value: &value,
                        },
                    )
                    .await
                    .map_err(|e| format!("{e:?}"))?;
            } else {
                let _: () = redis::cmd("SET")
                    .arg(&value_key)
                    .arg(&value)
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| e.to_string())?;
            }
            if round >= 20 {
                if fenced { &mut with } else { &mut without }.push(ms(start.elapsed()));
            }
        }
    }
    Ok((without, with))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("fence-db: {e}");
            return ExitCode::from(2);
        }
    };
    let mut source = Source {
        source: "fence-db".into(),
        ..Source::default()
    };
    source.versions = schema::palisade_versions(None);
    source
        .parameters
        .insert("rounds".into(), serde_json::json!(args.rounds));
    let mut failed = Vec::new();
    match postgres(args.rounds).await {
        Ok((without, with)) => source.figures.extend(figures(
            "postgres",
            &without,
            &with,
            "BEGIN; [SELECT palisade.fence;] INSERT; COMMIT at READ COMMITTED, fsync on; per-round difference",
        )),
        Err(e) => failed.push(format!("postgres: {e}")),
    }
    match redis(args.rounds).await {
        Ok((without, with)) => source.figures.extend(figures(
            "redis",
            &without,
            &with,
            "SET against the fencing script's SET, appendfsync always; per-round difference",
        )),
        Err(e) => failed.push(format!("redis: {e}")),
    }
    for f in &source.figures {
        println!(
            "fence-db: {:<9} {:<26} {:>8.3} {}",
            f.system, f.name, f.value, f.unit
        );
    }
    if let Err(e) = std::fs::create_dir_all(&args.out).and_then(|()| {
        std::fs::write(
            args.out.join("fence-db.json"),
            serde_json::to_string_pretty(&source).expect("serializes"),
        )
    }) {
        eprintln!("fence-db: writing {}: {e}", args.out.display());
        return ExitCode::FAILURE;
    }
    if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        for f in failed {
            eprintln!("fence-db: FAILED: {f}");
        }
        ExitCode::FAILURE
    }
}
