//! The controller under test.

use super::*;

/// `--controller-bin`, set once by `main`.
pub(crate) static CONTROLLER_BIN: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// The controller binary: `--controller-bin`, else the one of the same profile as this
/// bench (release under `cargo bench`, debug under `cargo test`).
pub(crate) fn controller_bin() -> PathBuf {
    CONTROLLER_BIN
        .get()
        .cloned()
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_palisade")))
}

pub(crate) struct Controller {
    pub(crate) child: tokio::process::Child,
    pub(crate) pid: u32,
    pub(crate) port: u16,
}

impl Controller {
    /// One controller alone (no leader election), as every phase but failover runs it.
    pub(crate) fn spawn(root: &Path, ns: &str, log: &Path) -> Result<Self> {
        Self::spawn_with(root, ns, log, &["--leader-elect=false".to_string()])
    }

    /// A controller with `flags` added (leader election: see `failover`).
    pub(crate) fn spawn_with(root: &Path, ns: &str, log: &Path, flags: &[String]) -> Result<Self> {
        let bin = controller_bin();
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let log = std::fs::File::options()
            .create(true)
            .append(true)
            .open(log)
            .with_context(|| format!("opening {}", log.display()))?;
        let child = tokio::process::Command::new(&bin)
            .args([
                "controller",
                "--namespace",
                ns,
                "--admin-addr",
                &format!("127.0.0.1:{port}"),
            ])
            .args(flags)
            .env("KUBECONFIG", root.join("target/cluster/kubeconfig"))
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let pid = child.id().context("controller exited at once")?;
        Ok(Self { child, pid, port })
    }

    pub(crate) async fn kill(&mut self) {
        let _ = self.child.start_kill(); // SIGKILL
        let _ = tokio::time::timeout(Duration::from_secs(10), self.child.wait()).await;
    }

    pub(crate) fn check_alive(&mut self) -> Result<()> {
        match self.child.try_wait()? {
            Some(status) => bail!("the controller exited: {status} (see its log)"),
            None => Ok(()),
        }
    }

    /// GET a path of the admin server: (status code, body).
    pub(crate) async fn get(&self, path: &str) -> Result<(u16, String)> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let fetch = async {
            let mut s = tokio::net::TcpStream::connect(("127.0.0.1", self.port)).await?;
            s.write_all(format!("GET {path} HTTP/1.0\r\n\r\n").as_bytes())
                .await?;
            let mut out = String::new();
            s.read_to_string(&mut out).await?;
            Ok::<_, std::io::Error>(out)
        };
        let out = tokio::time::timeout(Duration::from_secs(5), fetch)
            .await
            .context("admin server did not answer in 5 s")??;
        let code = out
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let body = out.split_once("\r\n\r\n").map_or("", |(_, b)| b);
        Ok((code, body.to_string()))
    }

    pub(crate) async fn metric(&self, name: &str) -> Result<f64> {
        let (_, body) = self.get("/metrics").await?;
        Ok(body
            .lines()
            .filter_map(|l| l.strip_prefix(name))
            .filter(|rest| rest.starts_with(' ') || rest.starts_with('{'))
            .filter_map(|rest| rest.rsplit(' ').next()?.trim().parse::<f64>().ok())
            .sum())
    }

    /// Polls /readyz every 10 ms.
    pub(crate) async fn wait_ready(&mut self, deadline: Instant) -> Result<Instant> {
        while Instant::now() < deadline {
            self.check_alive()?;
            if let Ok((200, _)) = self.get("/readyz").await {
                return Ok(Instant::now());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        bail!("the controller was not ready before --timeout")
    }

    /// Polls `palisade_grants_total` until it reaches `target()`, recording (s since `t0`, grants).
    pub(crate) async fn wait_grants(
        &mut self,
        target: &dyn Fn() -> f64,
        t0: Instant,
        deadline: Instant,
        timeline: &mut Vec<(f64, f64)>,
    ) -> Result<Instant> {
        while Instant::now() < deadline {
            self.check_alive()?;
            if let Ok(g) = self.metric("palisade_grants_total").await {
                let now = Instant::now();
                timeline.push(((now - t0).as_secs_f64(), g));
                if g >= target() {
                    return Ok(now);
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let last = timeline.last().map_or(0.0, |(_, g)| *g);
        bail!("{last} of {} grants before --timeout", target())
    }

    /// Waits until the controller uses under 5% of a core over half a second; returns
    /// the start of that quiet half second. After a minute it says so and goes on.
    pub(crate) async fn settle(&mut self, deadline: Instant) -> Result<Instant> {
        let until = Instant::now() + Duration::from_secs(60);
        let mut last = (Instant::now(), proc_cpu(self.pid).unwrap_or(0.0));
        while Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(100)).await;
            self.check_alive()?;
            let now = (Instant::now(), proc_cpu(self.pid).unwrap_or(0.0));
            let secs = (now.0 - last.0).as_secs_f64();
            if secs >= 0.5 {
                if (now.1 - last.1) / secs < 0.05 {
                    return Ok(last.0);
                }
                last = now;
            }
        }
        if Instant::now() >= deadline {
            bail!("--timeout reached");
        }
        eprintln!("scale: the controller was not idle after a minute; going on");
        Ok(Instant::now())
    }

    /// Waits until the namespace holds `expected` Events, less those this controller
    /// dropped (its queue is bounded) or failed to create: it publishes them off the
    /// write path, so they trail the grants. Stops waiting when nothing has changed for
    /// 30 s. Returns when the last change was seen, the namespace's count, and the
    /// Events this controller lost.
    pub(crate) async fn wait_events(
        &mut self,
        events: &Api<CoreEvent>,
        expected: usize,
        deadline: Instant,
    ) -> Result<(Instant, usize, usize)> {
        let mut seen = (Instant::now(), 0, 0);
        while Instant::now() < deadline {
            self.check_alive()?;
            let count = count_objects(events).await?;
            let lost = (self.metric("palisade_events_dropped_total").await?
                + self.metric("palisade_events_failed_total").await?)
                as usize;
            if (count, lost) != (seen.1, seen.2) {
                seen = (Instant::now(), count, lost);
            }
            if count + lost >= expected {
                return Ok(seen);
            }
            if seen.0.elapsed() > Duration::from_secs(30) {
                eprintln!(
                    "scale: {} of {expected} Events, none for 30 s; going on",
                    seen.1
                );
                return Ok(seen);
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        bail!("{} of {expected} Events before --timeout", seen.1)
    }
}
