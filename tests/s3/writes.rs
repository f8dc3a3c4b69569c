//! Fenced writes one at a time: create, equal and higher tokens, a stale token refused
//! with nothing written, and an object written unfenced refused rather than overwritten.

use bytes::Bytes;
use palisade::fence::Stale;
use palisade::fence::s3::{Condition, Error};

use crate::{fence, runtime, unique_key};

#[test]
fn creates_then_admits_equal_and_higher_tokens() {
    runtime().block_on(async {
        let fence = fence().await;
        let key = unique_key("writes");
        assert_eq!(fence.get(&key).await.unwrap(), None);
        let created = fence.put(&key, 5, b"balance 10".to_vec()).await.unwrap();
        assert_eq!((created.token, created.previous), (5, None));
        let again = fence.put(&key, 5, b"balance 20".to_vec()).await.unwrap();
        assert_eq!(again.previous, Some(5));
        let higher = fence.put(&key, 9, b"balance 30".to_vec()).await.unwrap();
        assert_eq!(higher.previous, Some(5));
        let stored = fence.get(&key).await.unwrap().expect("the object");
        assert_eq!(stored.token, 9);
        assert_eq!(stored.payload, b"balance 30");
        assert_eq!(stored.etag, higher.etag);
        // Every write stored different bytes: no ETag came back.
        let etags = [created.etag, again.etag, higher.etag];
        assert!(etags[0] != etags[1] && etags[1] != etags[2] && etags[0] != etags[2]);
    });
}

#[test]
fn a_stale_token_is_refused_and_nothing_is_written() {
    runtime().block_on(async {
        let fence = fence().await;
        let key = unique_key("stale");
        let current = fence.put(&key, 7, b"from 7".to_vec()).await.unwrap();
        let refused = fence.put(&key, 6, b"from 6".to_vec()).await;
        match refused {
            Err(Error::Stale(Stale {
                key: k,
                token: 6,
                highest: 7,
            })) => assert_eq!(k, key),
            other => panic!("expected Stale(6 < 7), got {other:?}"),
        }
        let stored = fence.get(&key).await.unwrap().expect("the object");
        assert_eq!(
            (stored.token, stored.payload.as_slice()),
            (7, &b"from 7"[..])
        );
        assert_eq!(stored.etag, current.etag, "the object was rewritten");
    });
}

#[test]
fn an_object_written_unfenced_is_refused_not_overwritten() {
    runtime().block_on(async {
        let fence = fence().await;
        let key = unique_key("unfenced");
        let plain = fence
            .client()
            .put(
                &key,
                Bytes::from_static(b"report.csv"),
                &Condition::None,
                &[],
            )
            .await
            .unwrap();
        assert!(plain.status.is_success(), "{}", plain.describe());
        let refused = fence.put(&key, 100, b"fenced".to_vec()).await;
        assert!(
            matches!(&refused, Err(Error::Unfenced { key: k }) if *k == key),
            "{refused:?}"
        );
        let message = refused.unwrap_err().to_string();
        assert!(
            message.contains("without a palisade fencing token"),
            "{message}"
        );
        assert!(matches!(fence.get(&key).await, Err(Error::Unfenced { .. })));
        let body = fence.client().get(&key).await.unwrap().body;
        assert_eq!(
            body.as_ref(),
            b"report.csv",
            "the unfenced object was overwritten"
        );
    });
}

#[test]
fn a_damaged_fenced_object_is_reported_not_overwritten() {
    runtime().block_on(async {
        let fence = fence().await;
        let key = unique_key("damaged");
        let body = Bytes::from_static(b"palisade-fence/1 token=abc write=x\npayload");
        let meta = [(palisade::fence::s3::TOKEN_METADATA, "abc")];
        let reply = fence.client().put(&key, body, &Condition::None, &meta);
        assert!(reply.await.unwrap().status.is_success());
        let refused = fence.put(&key, 1, b"x".to_vec()).await;
        assert!(
            matches!(&refused, Err(Error::Corrupt { .. })),
            "{refused:?}"
        );
        assert!(refused.unwrap_err().to_string().contains("\"abc\""));
        let read = fence.get(&key).await;
        assert!(
            matches!(&read, Err(Error::Corrupt { reason, .. }) if reason.contains("token")),
            "{read:?}"
        );
    });
}
