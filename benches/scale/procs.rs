//! CPU and memory from /proc.

use super::*;

pub(crate) fn read_pid(path: &Path) -> Option<u32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

pub(crate) use super::cpu::{machine_cpu, proc_cpu};

/// A `VmHWM`/`VmRSS` line of /proc/PID/status, in KiB.
pub(crate) fn status_kib(pid: u32, field: &str) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

pub(crate) struct Procs {
    pub(crate) controller: u32,
    pub(crate) apiserver: Option<u32>,
    pub(crate) etcd: Option<u32>,
    pub(crate) kcm: Option<u32>,
}

#[derive(Clone, Copy)]
pub(crate) struct CpuSnap {
    pub(crate) at: Instant,
    pub(crate) controller: f64,
    pub(crate) apiserver: f64,
    pub(crate) etcd: f64,
    pub(crate) kcm: f64,
    pub(crate) bench: f64,
    pub(crate) busy: f64,
}

impl Procs {
    pub(crate) fn snap(&self) -> CpuSnap {
        let cpu = |pid: Option<u32>| pid.and_then(proc_cpu).unwrap_or(0.0);
        CpuSnap {
            at: Instant::now(),
            controller: cpu(Some(self.controller).filter(|p| *p != 0)),
            apiserver: cpu(self.apiserver),
            etcd: cpu(self.etcd),
            kcm: cpu(self.kcm),
            bench: cpu(Some(std::process::id())),
            busy: machine_cpu().map_or(0.0, |(busy, _)| busy),
        }
    }
}

impl CpuSnap {
    pub(crate) fn since(&self, start: &CpuSnap) -> CpuWindow {
        CpuWindow {
            secs: (self.at - start.at).as_secs_f64().max(1e-3),
            controller: self.controller - start.controller,
            apiserver: self.apiserver - start.apiserver,
            etcd: self.etcd - start.etcd,
            kcm: self.kcm - start.kcm,
            bench: self.bench - start.bench,
            machine: self.busy - start.busy,
        }
    }
}

/// CPU seconds used in a window of `secs` seconds.
pub(crate) struct CpuWindow {
    pub(crate) secs: f64,
    pub(crate) controller: f64,
    pub(crate) apiserver: f64,
    pub(crate) etcd: f64,
    pub(crate) kcm: f64,
    pub(crate) bench: f64,
    pub(crate) machine: f64,
}

impl CpuWindow {
    /// Percent of one core.
    pub(crate) fn pct(&self, cpu_s: f64) -> f64 {
        cpu_s / self.secs * 100.0
    }

    /// CPU of processes outside this benchmark and its control plane (other work on the machine).
    pub(crate) fn others(&self) -> f64 {
        // As it comes out, never clamped: below 0 means the per-process and the
        // machine-wide counts were read a moment apart.
        self.machine - self.apiserver - self.etcd - self.kcm - self.controller - self.bench
    }

    pub(crate) fn split(&self, cores: f64) -> String {
        format!(
            "CPU over {:.1} s (% of one core): kube-apiserver {:.0}%, etcd {:.0}%, controller {:.0}%, bench {:.0}%, kube-controller-manager {:.0}%, other processes {:.0}%; machine {:.0}% of {:.0}%",
            self.secs,
            self.pct(self.apiserver),
            self.pct(self.etcd),
            self.pct(self.controller),
            self.pct(self.bench),
            self.pct(self.kcm),
            self.pct(self.others()),
            self.pct(self.machine),
            cores * 100.0
        )
    }

    /// Which side ran out: the controller if it uses about 100% of a core (it decides
    /// on one task); else, when the machine is full, whoever used most of it (the API
    /// server is kube-apiserver and etcd); else the API server if its write rate is
    /// near the create rate it took alone during setup; else nothing CPU-bound.
    pub(crate) fn verdict(&self, cores: f64, writes_per_s: f64, capacity: f64) -> String {
        let ctrl = self.pct(self.controller);
        let api = self.pct(self.apiserver);
        let etcd = self.pct(self.etcd);
        let others = self.pct(self.others());
        let machine = self.pct(self.machine);
        let load = writes_per_s / capacity.max(1e-3) * 100.0;
        let rate = format!(
            "{writes_per_s:.0} API writes/s ({load:.0}% of the {capacity:.0} creates/s it took alone in setup)"
        );
        let apiserver = format!(
            "kube-apiserver (cpu {api:.0}%, etcd {etcd:.0}%; {rate}), controller cpu {ctrl:.0}%"
        );
        let who = if ctrl >= 90.0 {
            format!(
                "controller (cpu {ctrl:.0}% of a core: it decides on one task), kube-apiserver cpu {api:.0}%; {rate}"
            )
        } else if machine >= 0.85 * cores * 100.0 {
            if api + etcd >= others.max(ctrl) {
                format!("{apiserver}; the machine was full and the API server used most of it")
            } else {
                format!(
                    "the machine ({machine:.0}% of {:.0}%), mostly other processes ({others:.0}%); kube-apiserver cpu {api:.0}%, controller cpu {ctrl:.0}%; {rate}",
                    cores * 100.0
                )
            }
        } else if load >= 70.0 || api + etcd >= 0.85 * cores * 100.0 {
            apiserver
        } else {
            format!(
                "nothing CPU-bound (latency: the controller writes 16 Leases at a time), kube-apiserver cpu {api:.0}%, controller cpu {ctrl:.0}%; {rate}"
            )
        };
        format!("saturated: {who}. {}", self.split(cores))
    }
}
