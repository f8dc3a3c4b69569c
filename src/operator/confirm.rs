//! Confirming that every API server refuses the predecessor's token, before a new
//! leader's first write.
//!
//! An API server judges a write against the Lease as its own informer has seen it,
//! which lags etcd: milliseconds on one server, seconds on a loaded replicated plane.
//! Until a server has seen grant `T`, it still accepts the old leader's token `T - 1`
//! and lower. Once it refuses `T - 1` it refuses every older token for good (an
//! informer only moves forward), and a write it admitted earlier cannot land on an
//! object the new leader has written since: updates and deletes commit by
//! compare-and-swap on the object's revision, and a failed swap is admitted again,
//! now against the newer grant. So the new leader asks each server, with a dry-run
//! create of the Lease itself stamped with `T - 1`, until every one refuses it. What
//! remains: a create admitted before the confirmation and still held inside an API
//! server can land after the new leader deleted that object (docs/operators.md).
//!
//! Not chosen: waiting a fixed time (no bound on an informer's lag holds); a
//! validating webhook reading the Lease with a quorum read (a process, TLS and a
//! network path in every write, and a write held after its check lands later anyway);
//! per-object token stamps (metadata does not survive a `/status` write, where most of
//! an operator's writes go).

use std::time::Duration;

use http::Uri;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{ListParams, PostParams};
use kube::{Api, Client, Config};

use super::Error;
use super::stamp::TokenCell;
use crate::crd::{Lease, LeaseSpec};

/// What one API server answered the probe.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// Refused `T - 1` as stale: it has seen grant `T`.
    Refuses,
    /// Admitted `T - 1` (the dry-run create then found the Lease exists): behind.
    StillAccepts,
    /// Created the Lease in a dry run: it does not exist, so the policy judges nothing.
    LeaseMissing,
    /// Anything else (unreachable, a 5xx, another refusal): ask again.
    Unknown(String),
}

/// Names the answer to the probe from its result.
pub fn classify(result: &Result<Lease, kube::Error>) -> Answer {
    match result {
        Ok(_) => Answer::LeaseMissing,
        Err(kube::Error::Api(status))
            if status.code == 403 && status.message.contains("stale fencing token") =>
        {
            Answer::Refuses
        }
        Err(kube::Error::Api(status)) if status.code == 409 => Answer::StillAccepts,
        Err(kube::Error::Api(status)) => {
            Answer::Unknown(format!("HTTP {}: {}", status.code, status.message))
        }
        Err(other) => Answer::Unknown(other.to_string()),
    }
}

/// Where the API servers are: `PALISADE_APISERVERS` (comma-separated base URLs), else
/// the endpoints the `kubernetes` Service publishes (each API server writes its own
/// address there), else the configuration's server alone.
pub async fn discover(client: &Client, config: &Config) -> Result<Vec<Uri>, Error> {
    if let Ok(list) = std::env::var("PALISADE_APISERVERS") {
        return parse_list(&list);
    }
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), "default");
    let listed = slices
        .list(&ListParams::default().labels("kubernetes.io/service-name=kubernetes"))
        .await
        .map_err(Error::Discover)?;
    let servers = endpoint_urls(&listed.items);
    Ok(if servers.is_empty() {
        vec![config.cluster_url.clone()]
    } else {
        servers
    })
}

/// `a,b,c` as URLs; an entry that is not an absolute URL is an error naming it.
pub fn parse_list(list: &str) -> Result<Vec<Uri>, Error> {
    let servers = list
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| match s.parse::<Uri>() {
            Ok(uri) if uri.scheme().is_some() && uri.authority().is_some() => Ok(uri),
            _ => Err(Error::Servers(format!(
                "PALISADE_APISERVERS: {s:?} is not a base URL such as https://10.0.0.1:6443"
            ))),
        })
        .collect::<Result<Vec<_>, _>>()?;
    if servers.is_empty() {
        return Err(Error::Servers(
            "PALISADE_APISERVERS is set but names no server".into(),
        ));
    }
    Ok(servers)
}

/// `https://<address>:<port>` for every ready address of the slices, on their port
/// named `https`.
pub fn endpoint_urls(slices: &[EndpointSlice]) -> Vec<Uri> {
    let mut urls = Vec::new();
    for slice in slices {
        let Some(port) = slice
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some("https"))
            .and_then(|p| p.port)
        else {
            continue;
        };
        for endpoint in &slice.endpoints {
            let ready = endpoint
                .conditions
                .as_ref()
                .and_then(|c| c.ready)
                .unwrap_or(true);
            if !ready {
                continue;
            }
            for address in &endpoint.addresses {
                let host = if address.contains(':') {
                    format!("[{address}]")
                } else {
                    address.clone()
                };
                if let Ok(uri) = format!("https://{host}:{port}").parse() {
                    urls.push(uri);
                }
            }
        }
    }
    urls
}

/// A client for `server` with `config`'s credentials, stamping `T - 1`. TLS is
/// verified against the name the configuration uses, so an API server's address
/// needs no certificate of its own.
fn probe_client(
    config: &Config,
    server: &Uri,
    username: &str,
    stale: i64,
) -> Result<Client, Error> {
    let mut config = config.clone();
    if *server != config.cluster_url {
        if config.tls_server_name.is_none() {
            config.tls_server_name = config.cluster_url.host().map(str::to_string);
        }
        config.cluster_url = server.clone();
    }
    super::stamped_client(config, username, TokenCell::fixed(stale))
}

/// Asks every server until each refuses `token - 1`, or `timeout` passes.
pub async fn confirm(
    config: &Config,
    servers: &[Uri],
    username: &str,
    namespace: &str,
    lease: &str,
    token: i64,
    timeout: Duration,
) -> Result<(), Error> {
    if token <= 1 {
        return Ok(());
    }
    let mut probe = Lease::new(lease, LeaseSpec::default());
    probe.metadata.namespace = Some(namespace.to_string());
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let mut pending = Vec::new();
    for server in servers {
        let client = probe_client(config, server, username, token - 1)?;
        pending.push((
            server.clone(),
            Api::<Lease>::namespaced(client, namespace),
            Answer::Unknown("not asked yet".into()),
        ));
    }
    let deadline = tokio::time::Instant::now() + timeout;
    let mut pause = Duration::from_millis(10);
    loop {
        for (server, api, last) in &mut pending {
            *last = classify(&api.create(&dry_run, &probe).await);
            if *last == Answer::LeaseMissing {
                return Err(Error::LeaseMissing(format!(
                    "{namespace}/{lease} (asked {server})"
                )));
            }
        }
        pending.retain(|(_, _, answer)| *answer != Answer::Refuses);
        if pending.is_empty() {
            return Ok(());
        }
        if tokio::time::Instant::now() + pause > deadline {
            let waiting = pending
                .iter()
                .map(|(server, _, answer)| format!("{server}: {answer:?}"))
                .collect::<Vec<_>>()
                .join("; ");
            return Err(Error::NotConfirmed { token, waiting });
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(250));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort};
    use kube::core::Status;

    fn refusal(code: u16, message: &str) -> Result<Lease, kube::Error> {
        Err(kube::Error::Api(Box::new(
            Status::failure(message, "").with_code(code),
        )))
    }

    #[test]
    fn answers_are_named_from_code_and_message() {
        let stale = "ValidatingAdmissionPolicy ... denied request: CREATE leases ops/l refused: stale fencing token 41 of system:serviceaccount:ops:op is lower than the current token 42";
        assert_eq!(classify(&refusal(403, stale)), Answer::Refuses);
        assert_eq!(
            classify(&refusal(409, "leases \"l\" already exists")),
            Answer::StillAccepts
        );
        assert_eq!(
            classify(&Ok(Lease::new("l", LeaseSpec::default()))),
            Answer::LeaseMissing
        );
        let rbac = classify(&refusal(403, "cannot impersonate resource userextras"));
        assert!(
            matches!(rbac, Answer::Unknown(ref m) if m.contains("impersonate")),
            "{rbac:?}"
        );
    }

    #[test]
    fn servers_are_the_ready_https_endpoints() {
        let slice = EndpointSlice {
            address_type: "IPv4".into(),
            ports: Some(vec![EndpointPort {
                name: Some("https".into()),
                port: Some(6443),
                ..Default::default()
            }]),
            endpoints: vec![
                Endpoint {
                    addresses: vec!["10.0.0.1".into(), "fd00::2".into()],
                    ..Default::default()
                },
                Endpoint {
                    addresses: vec!["10.0.0.3".into()],
                    conditions: Some(EndpointConditions {
                        ready: Some(false),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        let urls: Vec<String> = endpoint_urls(&[slice]).iter().map(Uri::to_string).collect();
        assert_eq!(urls, ["https://10.0.0.1:6443/", "https://[fd00::2]:6443/"]);
    }

    #[test]
    fn a_server_list_names_its_bad_entry() {
        let servers = parse_list("https://127.0.0.1:6443, https://127.0.0.1:6444").unwrap();
        assert_eq!(servers.len(), 2);
        let error = parse_list("https://127.0.0.1:6443,127.0.0.1")
            .unwrap_err()
            .to_string();
        assert!(error.contains("\"127.0.0.1\""), "{error}");
        assert!(parse_list(" , ").is_err());
    }
}
