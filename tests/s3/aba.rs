//! The ETag ABA case. A single-part PUT's ETag is the MD5 of its bytes, and metadata
//! does not change it: with the token in metadata only, bytes written again bring an
//! old ETag back, and a stale writer's `If-Match` on it succeeds. The fence's envelope
//! makes every write's bytes unique, so the stale writer's `If-Match` fails.
//!
//! Both tests replay the stale writer's interleaving by hand: it read the object
//! (ETag E0, token 5), was paused while the next holder (token 6) wrote other bytes and
//! then the same payload again, and now sends its conditional PUT with E0.

use bytes::Bytes;
use palisade::fence::s3::{Condition, Error, S3Fence, TOKEN_METADATA, envelope};

use crate::{fence, runtime, unique_key};

const W: &[u8] = b"settlement 2026-12-04: 1841 payments";

/// A PUT with the token in metadata only, the way a fence without the envelope writes.
async fn metadata_only_put(
    fence: &S3Fence,
    key: &str,
    token: u64,
    body: &'static [u8],
    condition: &Condition,
) -> (u16, Option<String>) {
    let token = token.to_string();
    let reply = fence
        .client()
        .put(
            key,
            Bytes::from_static(body),
            condition,
            &[(TOKEN_METADATA, &token)],
        )
        .await
        .unwrap();
    (reply.status.as_u16(), reply.etag())
}

/// Without the envelope the hole is real on this server: the same bytes get the same
/// ETag whatever the metadata, and the stale If-Match lands, lowering the token. This
/// is what the fence must not do (and what the next test shows it does not).
#[test]
fn without_the_envelope_a_repeated_etag_lets_a_stale_write_land() {
    runtime().block_on(async {
        let fence = fence().await;
        let key = unique_key("aba-bare");
        let (_, e0) = metadata_only_put(&fence, &key, 5, W, &Condition::None).await;
        let e0 = e0.expect("an ETag");
        // The stale writer read (E0, token 5) here, then paused. The new holder:
        metadata_only_put(&fence, &key, 6, b"interim", &Condition::Matches(e0.clone())).await;
        let (_, e6) = metadata_only_put(&fence, &key, 6, W, &Condition::None).await;
        assert_eq!(
            e6.as_deref(),
            Some(e0.as_str()),
            "the same bytes got a new ETag"
        );
        // The stale writer wakes up: its If-Match holds against the token-6 object.
        let (status, _) =
            metadata_only_put(&fence, &key, 5, b"stale", &Condition::Matches(e0)).await;
        assert_eq!(status, 200, "the stale If-Match was refused");
        let head = fence.client().head(&key).await.unwrap();
        assert_eq!(
            head.header("x-amz-meta-palisade-token").as_deref(),
            Some("5")
        );
    });
}

/// Through the fence: the token-6 holder's rewrite of the same payload stores other
/// bytes, so E0 never comes back, the stale If-Match gets 412, and the stale writer's
/// own `put` (which reads again on 412) is refused as Stale.
#[test]
fn through_the_fence_the_same_payload_again_gives_a_stale_writer_412() {
    runtime().block_on(async {
        let fence = fence().await;
        let key = unique_key("aba-fenced");
        let e0 = fence
            .put(&key, 5, W.to_vec())
            .await
            .unwrap()
            .etag
            .expect("an ETag");
        fence.put(&key, 6, b"interim".to_vec()).await.unwrap();
        let again = fence.put(&key, 6, W.to_vec()).await.unwrap();
        assert_ne!(
            again.etag.as_deref(),
            Some(e0.as_str()),
            "an ETag came back"
        );
        // The stale writer's conditional PUT, as S3Fence::put sends it after its read.
        let write_id = envelope::write_id();
        let stale = envelope::wrap(5, &write_id, b"stale");
        let reply = fence
            .client()
            .put(
                &key,
                Bytes::from(stale),
                &Condition::Matches(e0),
                &[(TOKEN_METADATA, "5")],
            )
            .await
            .unwrap();
        assert_eq!(reply.status.as_u16(), 412, "{}", reply.describe());
        let refused = fence.put(&key, 5, b"stale".to_vec()).await;
        assert!(matches!(refused, Err(Error::Stale(_))), "{refused:?}");
        let stored = fence.get(&key).await.unwrap().expect("the object");
        assert_eq!((stored.token, stored.payload.as_slice()), (6, W));
    });
}
