//! A seeded random number generator (SplitMix64).
//!
//! Written by hand rather than taken from `rand`: `SEED=7` must name the same
//! fault schedule for as long as the suite exists, and `rand` does not promise
//! that its generators keep their output across versions. SplitMix64 is a fixed,
//! published algorithm of a few lines.

pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..hi` (`hi > lo`).
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo)
    }

    /// Uniform in `lo..hi` milliseconds.
    pub fn millis(&mut self, lo: u64, hi: u64) -> std::time::Duration {
        std::time::Duration::from_millis(self.range(lo, hi))
    }

    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.range(0, i as u64 + 1) as usize;
            items.swap(i, j);
        }
    }
}

/// CLOCK_MONOTONIC in nanoseconds: one clock for every process on the machine, so
/// the harness and the workers can order each other's events. (Rust's `Instant`
/// reads the same clock but cannot be sent to another process.)
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
