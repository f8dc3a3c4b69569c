//! `palisade fence --store s3://BUCKET`: write one object through the object-store
//! fence (`--key` is the object's key, `--body-file PATH|-` or `--payload TEXT` its
//! content); and `palisade fence check s3://BUCKET/PREFIX`: probe the server.
//!
//! The server and credentials come from the standard AWS environment
//! ([`S3Config::from_env`]). An object store needs no setup (`--create` is refused):
//! the first fenced write creates the object, and the object is its own mark.

use std::io::Read;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use super::{FenceArgs, Refusal, Threads, block_on, error_chain};
use crate::cli::parse_duration;
use crate::fence::s3::probe::{self, ProbeOptions};
use crate::fence::s3::{Error, S3Config, S3Fence, Written};

/// A fenced write may carry a large body: a longer bound than a mark's round trip.
const WRITE_TIMEOUT: Duration = Duration::from_secs(60);

/// `palisade fence check s3://BUCKET/PREFIX`.
///
/// Exit codes: 0 every check passed; 1 a check failed, or the probe could not run
/// (no bucket, access denied, ...); 2 bad arguments.
#[derive(clap::Args, Debug)]
#[command(
    after_help = "Exit codes: 0 the server honours conditional writes atomically in every \
                  check, 1 a check failed or the probe could not run, 2 bad arguments."
)]
pub struct CheckArgs {
    /// The bucket, and a prefix under which the probe's keys are made (and deleted).
    #[arg(value_name = "s3://BUCKET[/PREFIX]")]
    pub url: String,

    /// Rounds of each race (racing creates, racing updates).
    #[arg(long, default_value_t = ProbeOptions::default().rounds, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub rounds: u32,

    /// Writers racing in each round.
    #[arg(long, default_value_t = ProbeOptions::default().writers, value_parser = clap::value_parser!(u32).range(2..=64))]
    pub writers: u32,

    /// KiB each racing writer sends: large bodies widen the gap between a server's
    /// check and its write, where a non-atomic server races.
    #[arg(long, default_value_t = (ProbeOptions::default().body_bytes >> 10) as u64, value_parser = clap::value_parser!(u64).range(1..=65536))]
    pub body_kib: u64,

    /// No new round starts after this long (e.g. 2m).
    #[arg(long, default_value = "120s", value_parser = parse_duration)]
    pub time_limit: Duration,

    /// The bound on each request.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub request_timeout: Duration,
}

/// `s3://BUCKET[/PREFIX]` taken apart.
fn parse_url(url: &str) -> Result<(&str, &str), String> {
    let rest = url
        .strip_prefix("s3://")
        .ok_or_else(|| format!("{url:?} is not an s3:// URL (s3://BUCKET[/PREFIX])"))?;
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    if bucket.is_empty() {
        return Err(format!("{url:?} names no bucket (s3://BUCKET[/PREFIX])"));
    }
    Ok((bucket, prefix))
}

fn config(bucket: &str, timeout: Duration) -> Result<S3Config, Refusal> {
    let mut config = S3Config::from_env(bucket).map_err(Refusal::store)?;
    config.timeout = timeout;
    Ok(config)
}

/// `palisade fence check URL`.
pub fn check(args: CheckArgs) -> ExitCode {
    let (bucket, prefix) = match parse_url(&args.url) {
        Ok(parts) => parts,
        Err(e) => return Refusal::Usage(e.into()).report(),
    };
    let options = ProbeOptions {
        rounds: args.rounds,
        writers: args.writers,
        body_bytes: (args.body_kib as usize) << 10,
        time_limit: args.time_limit,
    };
    block_on("fence check", Threads::One, async {
        let fence = match config(bucket, args.request_timeout)
            .and_then(|c| S3Fence::new(&c).map_err(Refusal::store))
        {
            Ok(fence) => fence,
            Err(refusal) => return refusal.report(),
        };
        match probe::probe(fence.client(), prefix, &options).await {
            Ok(report) => {
                println!("{report}");
                if report.passed() {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::FAILURE
                }
            }
            Err(e) => {
                eprintln!("palisade fence check: {}", error_chain(&e));
                ExitCode::FAILURE
            }
        }
    })
}

/// `palisade fence --store s3://BUCKET --key KEY --token T --body-file PATH|-`, or
/// `--show` for the object's token.
pub async fn write(args: &FenceArgs, url: &str) -> Result<String, Refusal> {
    let (bucket, prefix) = parse_url(url).map_err(|e| Refusal::Usage(e.into()))?;
    if !prefix.is_empty() {
        return Err(Refusal::Usage(
            format!("{url:?}: give the bucket only (s3://BUCKET) and the object with --key").into(),
        ));
    }
    if args.create {
        return Err(Refusal::Usage(
            "an s3:// store needs no --create: the first fenced write creates the object".into(),
        ));
    }
    let fence = S3Fence::new(&config(bucket, WRITE_TIMEOUT)?).map_err(refusal)?;
    if args.show {
        let object = fence.get(&args.key).await.map_err(refusal)?;
        let marks: crate::fence::Marks = object
            .map(|o| (args.key.clone(), o.token))
            .into_iter()
            .collect();
        return Ok(super::show_marks(&marks));
    }
    let token = args.token.ok_or_else(Refusal::token_required)?;
    let body = match (&args.body_file, &args.payload) {
        (Some(path), None) => read_body(path)?,
        (None, Some(text)) => text.clone().into_bytes(),
        _ => {
            return Err(Refusal::Usage(
                "an s3:// store needs the object's content: --body-file PATH (- for stdin) \
                 or --payload TEXT"
                    .into(),
            ));
        }
    };
    let written = fence.put(&args.key, token, body).await.map_err(refusal)?;
    Ok(written_line(bucket, &args.key, &written))
}

fn refusal(e: Error) -> Refusal {
    match e {
        Error::Stale(stale) => Refusal::Stale(stale),
        e @ Error::BadInput(_) => Refusal::Usage(Box::new(e)),
        e => Refusal::store(e),
    }
}

fn read_body(path: &Path) -> Result<Vec<u8>, Refusal> {
    let mut body = Vec::new();
    let read = if path == Path::new("-") {
        std::io::stdin().read_to_end(&mut body).map(|_| ())
    } else {
        std::fs::File::open(path).and_then(|mut f| f.read_to_end(&mut body).map(|_| ()))
    };
    read.map_err(|e| {
        Refusal::Usage(format!("cannot read --body-file {}: {e}", path.display()).into())
    })?;
    Ok(body)
}

fn written_line(bucket: &str, key: &str, written: &Written) -> String {
    let previous = match written.previous {
        None => "created the object".to_owned(),
        Some(p) if p == written.token => "same as the object's token".to_owned(),
        Some(p) => format!("the object's token was {p}"),
    };
    format!(
        "written: fencing token {} for s3://{bucket}/{key} ({previous}); ETag {}",
        written.token,
        written.etag.as_deref().unwrap_or("(none given)")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_a_bucket_and_maybe_a_prefix() {
        assert_eq!(parse_url("s3://b"), Ok(("b", "")));
        assert_eq!(parse_url("s3://b/p/q"), Ok(("b", "p/q")));
        assert!(parse_url("s3://").is_err());
        assert!(parse_url("gs://b").is_err());
    }
}
