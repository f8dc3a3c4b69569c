//! Racing holders with interleaved tokens on SeaweedFS: through the fence a lower token
//! never overwrites a higher one; with the same race and a fence that checks the token
//! but writes without the object's precondition, one does.
//!
//! Each round, writers with tokens `100 * round + 0..WRITERS` write the same key at
//! once, after the previous round's writers (all lower tokens). A round is *lowered*
//! when the object it leaves holds a token below the highest token that was told its
//! write succeeded: a lower token overwrote it.

use std::future::Future;

use bytes::Bytes;
use palisade::fence::s3::{Condition, Error, S3Fence, TOKEN_METADATA};

use crate::{fence, runtime, unique_key};

const ROUNDS: u64 = 12;
const WRITERS: u64 = 8;

/// What one write attempt returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// Written, replacing an object with token `previous`.
    Written {
        previous: Option<u64>,
    },
    Stale,
}

#[derive(Debug, Default)]
struct RaceResult {
    rounds: u64,
    /// Rounds that ended with a token below the highest successful one.
    lowered: Vec<(u64, u64)>,
    /// Writes that replaced an object with a higher token (as the writer saw it).
    replaced_higher: u32,
    written: u32,
    stale: u32,
}

/// The rounds, with `write(fence, key, token)` as every writer's write.
async fn race<W, F>(fence: &S3Fence, key: &str, write: W) -> RaceResult
where
    W: Fn(S3Fence, String, u64) -> F,
    F: Future<Output = Outcome> + Send + 'static,
{
    let mut result = RaceResult::default();
    for round in 1..=ROUNDS {
        let mut writers = tokio::task::JoinSet::new();
        for w in 0..WRITERS {
            let token = 100 * round + w;
            let write = write(fence.clone(), key.to_owned(), token);
            writers.spawn(async move { (token, write.await) });
        }
        let mut highest_written = 0;
        while let Some(joined) = writers.join_next().await {
            let (token, outcome) = joined.expect("a writer panicked");
            match outcome {
                Outcome::Written { previous } => {
                    result.written += 1;
                    highest_written = highest_written.max(token);
                    if previous.is_some_and(|p| p > token) {
                        result.replaced_higher += 1;
                    }
                }
                Outcome::Stale => result.stale += 1,
            }
        }
        let stored = stored_token(fence, key).await;
        if stored < highest_written {
            result.lowered.push((stored, highest_written));
        }
        result.rounds += 1;
    }
    result
}

async fn stored_token(fence: &S3Fence, key: &str) -> u64 {
    let head = fence.client().head(key).await.unwrap();
    let token = head.header(&format!("x-amz-meta-{TOKEN_METADATA}"));
    token
        .and_then(|t| t.parse().ok())
        .expect("a token on the object")
}

async fn fenced_write(fence: S3Fence, key: String, token: u64) -> Outcome {
    match fence
        .put(&key, token, format!("from {token}").into_bytes())
        .await
    {
        Ok(written) => Outcome::Written {
            previous: written.previous,
        },
        Err(Error::Stale(_)) => Outcome::Stale,
        Err(e) => panic!("token {token}: {e}"),
    }
}

/// The fence without its compare-and-swap: read the token, compare, then PUT with no
/// precondition.
async fn check_then_write(fence: S3Fence, key: String, token: u64) -> Outcome {
    let head = fence.client().head(&key).await.unwrap();
    let previous = head
        .header(&format!("x-amz-meta-{TOKEN_METADATA}"))
        .and_then(|t| t.parse::<u64>().ok());
    if previous.is_some_and(|p| p > token) {
        return Outcome::Stale;
    }
    let body = Bytes::from(format!("from {token}"));
    let text = token.to_string();
    let meta = [(TOKEN_METADATA, text.as_str())];
    let reply = fence
        .client()
        .put(&key, body, &Condition::None, &meta)
        .await
        .unwrap();
    assert!(reply.status.is_success(), "{}", reply.describe());
    Outcome::Written { previous }
}

#[test]
fn racing_holders_through_the_fence_never_lower_the_token() {
    runtime().block_on(async {
        let fence = fence().await;
        let key = unique_key("race-fenced");
        let result = race(&fence, &key, fenced_write).await;
        assert_eq!(result.rounds, ROUNDS);
        assert!(
            result.lowered.is_empty(),
            "lowered (stored, highest written): {result:?}"
        );
        assert_eq!(result.replaced_higher, 0, "{result:?}");
        // The race was real: lower tokens arrived after higher ones and were refused.
        assert!(result.stale > 0, "no writer was ever stale: {result:?}");
        assert_eq!(result.written + result.stale, (ROUNDS * WRITERS) as u32);
        assert_eq!(stored_token(&fence, &key).await, 100 * ROUNDS + WRITERS - 1);
    });
}

/// Shows that the race above can fail: checking the token and then writing without the
/// object's precondition lets a lower token overwrite a higher one.
#[test]
fn racing_holders_without_the_precondition_lower_the_token() {
    runtime().block_on(async {
        let fence = fence().await;
        let key = unique_key("race-unfenced");
        let result = race(&fence, &key, check_then_write).await;
        assert!(
            !result.lowered.is_empty(),
            "no round ended below its highest successful token: {result:?}"
        );
    });
}
