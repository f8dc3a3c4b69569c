//! The chart's ValidatingAdmissionPolicies as a test meets them: a binding that is
//! new takes a moment to be enforced.

use std::time::{Duration, Instant};

/// How long a freshly created admission policy binding may take to become effective.
pub const POLICY_WARMUP: Duration = Duration::from_secs(15);

/// Retries `attempt` until it fails with a message containing `expected`, for at most
/// POLICY_WARMUP (a new policy binding takes a moment to be enforced). Each accepted
/// attempt is undone by `undo` before the next one.
pub async fn until_rejected<T, F, Fut, U, UFut>(
    what: &str,
    expected: &str,
    mut attempt: F,
    mut undo: U,
) -> Box<kube::core::Status>
where
    T: std::fmt::Debug,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, kube::Error>>,
    U: FnMut() -> UFut,
    UFut: std::future::Future<Output = ()>,
{
    let deadline = Instant::now() + POLICY_WARMUP;
    loop {
        match attempt().await {
            Err(kube::Error::Api(status)) if status.message.contains(expected) => return status,
            Err(e) => panic!("{what}: refused, but not by the policy ({expected:?}): {e:?}"),
            Ok(accepted) => {
                assert!(
                    Instant::now() < deadline,
                    "{what}: still accepted {POLICY_WARMUP:?} after installing the policy: {accepted:?}"
                );
                undo().await;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}
