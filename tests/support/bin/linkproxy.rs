//! `palisade-linkproxy`: the links of the HA test control plane (cluster.sh with
//! HA=1), each a [`support::proxy::Proxy`] on a fixed loopback port, and a control
//! port that tests (and people) send one-line commands to.
//!
//! ```text
//! palisade-linkproxy serve --control PORT --link NAME=LISTEN:UPSTREAM[,UPSTREAM...][:etcd-peer] ...
//! palisade-linkproxy send PORT 'COMMAND'
//! ```
//!
//! Commands (NAME may end in `*`, matching every link it begins):
//!
//! - `mode NAME pass|cut|blackhole|delay MS|latency MS`
//! - `refuse NAME ID[,ID...]` or `refuse NAME -`: an etcd-peer link drops connections
//!   from these members (etcd member IDs in hex), or none
//! - `links`: one line per link, `NAME LISTEN`
//!
//! Each command is answered with one line, `ok` or `error: ...`, then the links for
//! `links`, then the connection is closed.

use std::collections::{BTreeMap, BTreeSet};
use std::process::ExitCode;
use std::time::Duration;

use palisade_test_support::proxy::{Mode, Options, Proxy};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let result = match args.first().map(String::as_str) {
        Some("serve") => runtime.block_on(serve(&args[1..])),
        Some("send") if args.len() == 3 => runtime.block_on(async {
            let port = parse_port(&args[1])?;
            let reply = palisade_test_support::linkproxy::send(port, &args[2]).await?;
            print!("{reply}");
            Ok(())
        }),
        _ => Err("usage: palisade-linkproxy serve --control PORT --link NAME=LISTEN:UPSTREAM[,UPSTREAM...][:etcd-peer] ... | send PORT 'COMMAND'".into()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("palisade-linkproxy: {e}");
            ExitCode::from(2)
        }
    }
}

fn parse_port(s: &str) -> Result<u16, String> {
    s.parse().map_err(|_| format!("{s:?} is not a port number"))
}

/// `NAME=LISTEN:UPSTREAM[,UPSTREAM...][:etcd-peer]`.
fn parse_link(spec: &str) -> Result<(String, Options), String> {
    let bad = |why: &str| {
        format!("--link {spec:?}: {why} (NAME=LISTEN:UPSTREAM[,UPSTREAM...][:etcd-peer])")
    };
    let (name, rest) = spec.split_once('=').ok_or_else(|| bad("no '='"))?;
    if name.is_empty() || name.contains('*') {
        return Err(bad("a name, without '*'"));
    }
    let mut parts = rest.split(':');
    let listen = parse_port(parts.next().unwrap_or_default()).map_err(|e| bad(&e))?;
    let upstreams = parts
        .next()
        .ok_or_else(|| bad("no upstream"))?
        .split(',')
        .map(parse_port)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(&e))?;
    let etcd_peer = match parts.next() {
        None => false,
        Some("etcd-peer") => true,
        Some(other) => return Err(bad(&format!("unknown role {other:?}"))),
    };
    Ok((
        name.to_string(),
        Options {
            listen,
            upstreams,
            etcd_peer,
        },
    ))
}

async fn serve(args: &[String]) -> Result<(), String> {
    let mut control = None;
    let mut specs = Vec::new();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let value = it.next().ok_or_else(|| format!("{arg} needs a value"))?;
        match arg.as_str() {
            "--control" => control = Some(parse_port(value)?),
            "--link" => specs.push(parse_link(value)?),
            other => return Err(format!("unknown flag {other:?}")),
        }
    }
    let control = control.ok_or("--control PORT is required")?;
    let mut links = BTreeMap::new();
    for (name, options) in specs {
        let listen = options.listen;
        let proxy = Proxy::start_with(options)
            .await
            .map_err(|e| format!("link {name}: listening on {listen}: {e}"))?;
        links.insert(name, proxy);
    }
    let listener = TcpListener::bind(("127.0.0.1", control))
        .await
        .map_err(|e| format!("control port {control}: {e}"))?;
    loop {
        let (stream, _) = listener
            .accept()
            .await
            .map_err(|e| format!("control port: {e}"))?;
        // One command at a time: commands are rare and each is quick.
        let _ = answer(stream, &links).await;
    }
}

async fn answer(stream: TcpStream, links: &BTreeMap<String, Proxy>) -> std::io::Result<()> {
    let (read, mut write) = stream.into_split();
    let mut line = String::new();
    let read = tokio::time::timeout(
        Duration::from_secs(5),
        BufReader::new(read).read_line(&mut line),
    )
    .await;
    if !matches!(read, Ok(Ok(_))) {
        return Ok(());
    }
    let reply = match run(line.trim(), links) {
        Ok(text) => format!("ok\n{text}"),
        Err(e) => format!("error: {e}\n"),
    };
    write.write_all(reply.as_bytes()).await
}

/// Runs one command; the text after `ok`.
fn run(command: &str, links: &BTreeMap<String, Proxy>) -> Result<String, String> {
    let words: Vec<&str> = command.split_whitespace().collect();
    let matching = |pattern: &str| -> Result<Vec<&Proxy>, String> {
        let found: Vec<&Proxy> = links
            .iter()
            .filter(|(name, _)| match pattern.strip_suffix('*') {
                Some(prefix) => name.starts_with(prefix),
                None => name.as_str() == pattern,
            })
            .map(|(_, p)| p)
            .collect();
        if found.is_empty() {
            Err(format!("no link matches {pattern:?}"))
        } else {
            Ok(found)
        }
    };
    match words.as_slice() {
        ["links"] => Ok(links
            .iter()
            .map(|(name, p)| format!("{name} {}\n", p.port))
            .collect()),
        ["mode", pattern, mode @ ..] => {
            let mode = parse_mode(mode)?;
            for proxy in matching(pattern)? {
                proxy.set(mode);
            }
            Ok(String::new())
        }
        ["refuse", pattern, sources] => {
            let sources: BTreeSet<String> = match *sources {
                "-" => BTreeSet::new(),
                list => list.split(',').map(str::to_string).collect(),
            };
            for proxy in matching(pattern)? {
                proxy.refuse_sources(sources.clone());
            }
            Ok(String::new())
        }
        _ => Err(format!(
            "unknown command {command:?} (mode NAME pass|cut|blackhole|delay MS|latency MS, refuse NAME IDS|-, links)"
        )),
    }
}

fn parse_mode(words: &[&str]) -> Result<Mode, String> {
    let millis = |ms: &str| {
        ms.parse::<u64>()
            .map(Duration::from_millis)
            .map_err(|_| format!("{ms:?} is not a number of milliseconds"))
    };
    match words {
        ["pass"] => Ok(Mode::Pass),
        ["cut"] => Ok(Mode::Cut),
        ["blackhole"] => Ok(Mode::Blackhole),
        ["delay", ms] => Ok(Mode::Delay(millis(ms)?)),
        ["latency", ms] => Ok(Mode::Latency(millis(ms)?)),
        _ => Err(format!(
            "unknown mode {:?} (pass, cut, blackhole, delay MS, latency MS)",
            words.join(" ")
        )),
    }
}
