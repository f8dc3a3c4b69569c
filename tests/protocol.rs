//! Whether a client's connections are PINGed is decided by the protocol the API
//! server answers in, not by its configuration: `kubectl proxy` (the real API server
//! behind it) serves plain HTTP/1.1, whose connections carry no PINGs, so watches
//! there must be short; the API server itself answers HTTP/2.

use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};

use kube::Config;
use palisade::client::{AcquireOptions, LeaseClient, PodBinding};
use support::{ControllerProcess, TestNamespace, WAIT};

/// `kubectl proxy` on a port of its choosing; killed when dropped.
struct KubectlProxy {
    child: Child,
    url: String,
}

impl KubectlProxy {
    fn start() -> Self {
        let mut child = support::tools::kubectl_command()
            .args(["proxy", "--port=0", "--address=127.0.0.1"])
            .stdout(Stdio::piped())
            .spawn()
            .expect("kubectl proxy starts");
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        // "Starting to serve on 127.0.0.1:PORT"
        let address = line.trim().rsplit(' ').next().unwrap().to_string();
        assert!(
            address.starts_with("127.0.0.1:"),
            "kubectl proxy said {line:?}"
        );
        Self {
            child,
            url: format!("http://{address}"),
        }
    }
}

impl Drop for KubectlProxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn acquire_and_release(leases: &LeaseClient, lease: &str) {
    let options = AcquireOptions {
        identity: Some(lease.to_string()),
        pod: PodBinding::None,
        timeout: Some(WAIT),
        slot: None,
    };
    leases.ensure_lease(lease, 5).await.unwrap();
    let grant = leases.acquire(lease, options).await.unwrap();
    grant.release().await.unwrap();
}

#[tokio::test]
async fn watches_are_long_only_where_the_api_server_answers_in_http2() {
    support::install_crds().await;
    let ns = TestNamespace::new("protocol").await;
    let _controller = ControllerProcess::start(&ns.name, &["--leader-elect=false"]).await;

    let direct = LeaseClient::from_config(support::admin_config().await, Some(&ns.name)).unwrap();
    assert!(
        !direct.watches_pinged(),
        "nothing is known before an answer"
    );
    acquire_and_release(&direct, "direct").await;
    assert!(direct.watches_pinged(), "the API server answers in HTTP/2");

    let proxy = KubectlProxy::start();
    let config = Config::new(proxy.url.parse().unwrap());
    let proxied = LeaseClient::from_config(config, Some(&ns.name)).unwrap();
    acquire_and_release(&proxied, "proxied").await;
    assert!(
        !proxied.watches_pinged(),
        "kubectl proxy answers in HTTP/1.1: no PINGs, so no long watches"
    );
}
