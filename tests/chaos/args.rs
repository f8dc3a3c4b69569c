//! The suite's command-line arguments (`--duration 90s --seed 1 --workers 5 --leases 2
//! --semaphores 1 --permits 2 --keep-cluster --ha`) and their parsing, with libtest's
//! own flags ignored.

use std::time::Duration;

pub struct Args {
    pub duration: Duration,
    pub seed: u64,
    pub workers: usize,
    /// Lock Leases (`lease-<n>`).
    pub leases: usize,
    /// Semaphore Leases (`sem-<n>`), of `permits` slots each.
    pub semaphores: usize,
    pub permits: i32,
    pub keep_cluster: bool,
    /// On the replicated control plane, with its faults (ha.rs).
    pub ha: bool,
}

/// `90s`, `10m`, `1h`: the command line's duration syntax.
fn parse_duration(s: &str) -> Result<Duration, String> {
    palisade::cli::parse_duration(s).map_err(|e| format!("--duration: {e}"))
}

/// A number-valued flag's value.
fn parse_number<T: std::str::FromStr>(flag: &str, v: &str) -> Result<T, String> {
    v.parse().map_err(|_| format!("{flag} {v:?}: not a number"))
}

/// Our flags, and libtest's (which `cargo test -- --test-threads 4` passes to every
/// test binary) ignored. `Ok(None)`: a name filter that excludes this suite.
pub fn parse_args(raw: &[String]) -> Result<Option<Args>, String> {
    let mut args = Args {
        duration: Duration::from_secs(90),
        seed: 1,
        workers: 5,
        leases: 2,
        // Two permits: five workers over three Leases put more contenders than permits
        // on the semaphore often enough (a third of them at any moment, on average).
        semaphores: 1,
        permits: 2,
        keep_cluster: false,
        ha: false,
    };
    let mut it = raw.iter();
    let mut filters = Vec::new();
    while let Some(arg) = it.next() {
        let mut value = || it.next().cloned().ok_or(format!("{arg} needs a value"));
        match arg.as_str() {
            "--duration" => args.duration = parse_duration(&value()?)?,
            "--seed" => args.seed = parse_number("--seed", &value()?)?,
            "--workers" => args.workers = parse_number("--workers", &value()?)?,
            "--leases" => args.leases = parse_number("--leases", &value()?)?,
            "--semaphores" => args.semaphores = parse_number("--semaphores", &value()?)?,
            "--permits" => args.permits = parse_number("--permits", &value()?)?,
            "--keep-cluster" => args.keep_cluster = true,
            "--ha" => args.ha = true,
            "--test-threads" | "--skip" | "--format" | "--color" | "--logfile" | "-Z" => {
                value()?;
            }
            a if a.starts_with('-') => {} // a libtest switch: nothing for us
            filter => filters.push(filter.to_string()),
        }
    }
    if !filters.is_empty() && !filters.iter().any(|f| "chaos".contains(f.as_str())) {
        return Ok(None);
    }
    if args.workers < 2 || args.leases < 1 || args.workers < args.leases + args.semaphores {
        return Err("need at least 2 workers, 1 lease, and no more leases than workers".into());
    }
    if !(2..=palisade::permits::MAX_PERMITS).contains(&args.permits) {
        return Err(format!(
            "--permits {}: a semaphore has 2 to {} permits",
            args.permits,
            palisade::permits::MAX_PERMITS
        ));
    }
    if args.duration < Duration::from_secs(30) {
        // Below that even the first faults are not over. A longer run may still miss a
        // fault kind a rule needs (a Redis restart, say), and then fails as proving nothing.
        return Err("--duration: at least 30s".into());
    }
    Ok(Some(args))
}
