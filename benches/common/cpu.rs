//! CPU time from /proc, for the benches that say which process used the machine.

pub fn clock_ticks() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as f64 } else { 100.0 }
}

/// utime + stime of a process (all its threads), in seconds.
pub fn proc_cpu(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces: count fields after its closing parenthesis.
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest begins with field 3 (state); utime is field 14, stime 15.
    let ticks = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    Some(ticks / clock_ticks())
}

/// (busy, total) CPU seconds of the whole machine, all cores.
pub fn machine_cpu() -> Option<(f64, f64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().next()?.strip_prefix("cpu ")?;
    let v: Vec<f64> = line
        .split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal (guest time is inside user).
    let total: f64 = v.iter().take(8).sum();
    let idle = v.get(3)? + v.get(4)?;
    Some(((total - idle) / clock_ticks(), total / clock_ticks()))
}

/// The processes a sample's CPU time is split among: the local control plane's
/// (their pid files in its directory: etcd, kube-apiserver, the kubelet, containerd
/// and the rest), and the ones named.
pub struct Census {
    procs: Vec<(String, u32)>,
}

impl Census {
    pub fn new(cluster_dir: &std::path::Path, named: &[(&str, u32)]) -> Self {
        let mut procs: Vec<(String, u32)> =
            named.iter().map(|(n, p)| (n.to_string(), *p)).collect();
        for entry in std::fs::read_dir(cluster_dir)
            .into_iter()
            .flatten()
            .flatten()
        {
            let path = entry.path();
            let (Some(name), Some("pid")) = (
                path.file_stem().and_then(|s| s.to_str()),
                path.extension().and_then(|s| s.to_str()),
            ) else {
                continue;
            };
            if let Some(pid) = std::fs::read_to_string(&path)
                .ok()
                .and_then(|s| s.trim().parse().ok())
            {
                procs.push((name.to_string(), pid));
            }
        }
        Census { procs }
    }

    /// Each process's CPU seconds so far, then the machine's busy seconds.
    pub fn snap(&self) -> Vec<f64> {
        let mut v: Vec<f64> = self
            .procs
            .iter()
            .map(|(_, pid)| proc_cpu(*pid).unwrap_or(0.0))
            .collect();
        v.push(machine_cpu().map_or(0.0, |(busy, _)| busy));
        v
    }

    /// Between two snaps: the machine's busy CPU and the two processes that used the
    /// most, in ms of CPU ("machine 180: kube-apiserver 120, etcd 20").
    pub fn top(&self, before: &[f64], after: &[f64]) -> String {
        let used = |i: usize| (after[i] - before[i]) * 1e3;
        let mut by_use: Vec<usize> = (0..self.procs.len()).collect();
        by_use.sort_by(|a, b| used(*b).total_cmp(&used(*a)));
        let top: Vec<String> = by_use
            .iter()
            .take(2)
            .map(|i| format!("{} {:.0}", self.procs[*i].0, used(*i)))
            .collect();
        format!("machine {:.0}: {}", used(self.procs.len()), top.join(", "))
    }
}
