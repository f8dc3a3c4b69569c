//! Records a worker's renewals (with the claim's create and a waiter's early
//! confirmation, which vouch for a grant as a renewal does) and releases in its
//! history, as its client sent them and heard back, by wrapping the worker's Kubernetes client: the client library is
//! used exactly as an application uses it, and the checker learns when each renewal
//! was sent and what its response said (see `history::check_renewal_contract`).

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use kube::Client;
use kube::client::Body;

use crate::history::{Event, Recorder};
use crate::rng::now_ns;

/// `inner`, recording every POST (create), PATCH (renewal) and DELETE (release) of a
/// LeaseClaim.
pub fn recording(inner: Client, history: &Path, worker: &str) -> Client {
    let recorder = Arc::new(Mutex::new(
        Recorder::create(history).expect("opening the history file"),
    ));
    // Claim name -> UID, learned from responses (a DELETE's response may not say).
    let uids: Arc<Mutex<HashMap<String, String>>> = Arc::default();
    let worker = worker.to_string();
    let service = tower::service_fn(move |request: http::Request<Body>| {
        let (inner, recorder, uids, worker) = (
            inner.clone(),
            recorder.clone(),
            uids.clone(),
            worker.clone(),
        );
        async move {
            let claim = claim_name(request.uri().path()).map(str::to_string);
            let method = request.method().clone();
            let send_ns = now_ns();
            if let Some(name) = &claim
                && method == http::Method::DELETE
            {
                let claim_uid = uids.lock().unwrap().get(name).cloned().unwrap_or_default();
                recorder.lock().unwrap().record(&Event::Release {
                    worker: worker.clone(),
                    claim: name.clone(),
                    claim_uid,
                    t_ns: send_ns,
                });
            }
            let response = inner.send(request).await?;
            let creation = method == http::Method::POST;
            let renewal = claim.is_some() && method == http::Method::PATCH;
            if !renewal && !creation {
                return Ok::<_, kube::Error>(response);
            }
            let (parts, body) = response.into_parts();
            let bytes = body.collect_bytes().await?;
            let end_ns = now_ns();
            let object: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
            let field = |path: &str| {
                object
                    .pointer(path)
                    .and_then(|v| v.as_str())
                    .unwrap_or_default()
                    .to_string()
            };
            let (name, uid) = (field("/metadata/name"), field("/metadata/uid"));
            if field("/kind") == "LeaseClaim" && !name.is_empty() && !uid.is_empty() {
                uids.lock().unwrap().insert(name, uid);
            }
            // The claim's create vouches for a grant that follows it as a renewal
            // does (DESIGN.md, "Client deadlines"): recorded as one.
            let created = (creation && parts.status.is_success() && field("/kind") == "LeaseClaim")
                .then(|| field("/metadata/name"));
            if let Some(name) = claim.filter(|_| renewal).or(created) {
                let claim_uid = uids.lock().unwrap().get(&name).cloned().unwrap_or_default();
                recorder.lock().unwrap().record(&Event::Renewal {
                    worker,
                    claim: name,
                    claim_uid,
                    send_ns,
                    end_ns,
                    status: parts.status.as_u16(),
                    phase: field("/status/phase"),
                });
            }
            Ok(http::Response::from_parts(
                parts,
                Body::from(bytes.to_vec()),
            ))
        }
    });
    Client::new(service, "default")
}

/// The claim name of a request on one LeaseClaim (not its status, not the list).
fn claim_name(path: &str) -> Option<&str> {
    let (collection, name) = path.rsplit_once('/')?;
    (collection.ends_with("/leaseclaims") && !name.is_empty()).then_some(name)
}
