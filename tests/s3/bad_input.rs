//! Bad input gets a clear error naming the problem, and nothing is written.

use palisade::fence::s3::{Error, S3Fence};

use crate::{atomic_server, config, fence, runtime, unique_key};

#[test]
fn a_missing_bucket_is_named() {
    runtime().block_on(async {
        let bucket = "palisade-tests-no-such-bucket";
        let fence = S3Fence::new(&config(&atomic_server(), bucket)).unwrap();
        let refused = fence.put("k", 1, b"x".to_vec()).await;
        assert!(
            matches!(&refused, Err(Error::NoBucket { bucket: b }) if b == bucket),
            "{refused:?}"
        );
        assert!(refused.unwrap_err().to_string().contains(bucket));
        assert!(matches!(fence.get("k").await, Err(Error::NoBucket { .. })));
    });
}

#[test]
fn keys_and_tokens_out_of_range_are_refused_before_any_request() {
    runtime().block_on(async {
        let fence = fence().await;
        let key = unique_key("bad");
        let over = fence.put(&key, i64::MAX as u64 + 1, b"x".to_vec()).await;
        let message = over.unwrap_err().to_string();
        assert!(message.contains("9223372036854775808"), "{message}");
        assert!(message.contains("signed 64-bit"), "{message}");
        let empty = fence.put("", 1, b"x".to_vec()).await;
        assert!(
            matches!(empty, Err(Error::BadInput(ref m)) if m.contains("empty")),
            "{empty:?}"
        );
        let long = "k".repeat(1025);
        let too_long = fence.put(&long, 1, b"x".to_vec()).await;
        assert!(
            matches!(too_long, Err(Error::BadInput(ref m)) if m.contains("1024")),
            "{too_long:?}"
        );
        // The largest token and the longest key are fine.
        fence
            .put(&key, i64::MAX as u64, b"x".to_vec())
            .await
            .unwrap();
        assert_eq!(
            fence.get(&key).await.unwrap().unwrap().token,
            i64::MAX as u64
        );
        // In segments: SeaweedFS, like a file system, limits each one to 255 bytes.
        let mut longest = key.clone();
        while longest.len() < 1024 {
            let room = (1024 - longest.len() - 1).min(200);
            longest = format!("{longest}/{}", "k".repeat(room.max(1)));
        }
        let longest = &longest[..1024];
        fence.put(longest, 1, b"x".to_vec()).await.unwrap();
        assert!(fence.get(longest).await.unwrap().is_some());
    });
}

#[test]
fn wrong_credentials_are_denied_by_name() {
    runtime().block_on(async {
        let _ = fence().await;
        let mut bad = config(&atomic_server(), crate::BUCKET);
        bad.secret_access_key = "not-the-secret".into();
        let fence = S3Fence::new(&bad).unwrap();
        let refused = fence.put(&unique_key("denied"), 1, b"x".to_vec()).await;
        let message = refused.as_ref().unwrap_err().to_string();
        assert!(matches!(refused, Err(Error::Denied { .. })), "{message}");
        assert!(message.contains("AWS_SECRET_ACCESS_KEY"), "{message}");
    });
}

#[test]
fn an_endpoint_that_is_not_a_url_is_a_configuration_error() {
    let mut bad = config("http://127.0.0.1:1", crate::BUCKET);
    bad.endpoint = "127.0.0.1:18333".into();
    let refused = S3Fence::new(&bad).unwrap_err();
    assert!(matches!(refused, Error::Config(_)), "{refused:?}");
    assert!(refused.to_string().contains("127.0.0.1:18333"), "{refused}");
}
