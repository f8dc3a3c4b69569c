//! Stamping a request with the leader's fencing token.
//!
//! The token travels as an impersonation extra because admission sees
//! `request.userInfo.extra` on every verb and subresource: a delete, a `/status` or
//! `/scale` write, a server-side apply. An annotation does not survive a subresource
//! write, a field manager is absent from deletes, and a header of our own never
//! reaches admission. The operator impersonates its own service account, which the
//! API server authorizes like any impersonation and which adds the account's groups,
//! so nothing else about the request changes.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use http::{HeaderName, HeaderValue, Request};

/// The extra's key, as admission sees it.
pub const TOKEN_EXTRA: &str = "palisade.dev/fencing-token";

/// `Impersonate-Extra-` and the key with its `/` escaped (a header name cannot hold
/// one); the API server lowercases and unescapes it.
const TOKEN_HEADER: &str = "impersonate-extra-palisade.dev%2ffencing-token";
const USER_HEADER: &str = "impersonate-user";

/// The token to stamp, shared by every client of one operator; 0 is none.
#[derive(Clone, Debug, Default)]
pub struct TokenCell(Arc<AtomicI64>);

impl TokenCell {
    /// A cell holding `token` from the start.
    pub fn fixed(token: i64) -> Self {
        let cell = Self::default();
        cell.set(token);
        cell
    }

    pub fn get(&self) -> i64 {
        self.0.load(Ordering::Acquire)
    }

    pub fn set(&self, token: i64) {
        self.0.store(token, Ordering::Release);
    }
}

/// Adds the impersonation headers for `username` with the cell's token, if it holds
/// one; a request without a token goes as it is, and the policy refuses it.
#[derive(Clone, Debug)]
pub struct Stamp {
    user: HeaderValue,
    token: TokenCell,
}

impl Stamp {
    /// `username` must be a valid header value (a service account's name is).
    pub fn new(username: &str, token: TokenCell) -> Result<Self, http::header::InvalidHeaderValue> {
        Ok(Self {
            user: HeaderValue::from_str(username)?,
            token,
        })
    }

    pub fn apply<B>(&self, mut request: Request<B>) -> Request<B> {
        let token = self.token.get();
        if token > 0 {
            let headers = request.headers_mut();
            headers.insert(HeaderName::from_static(USER_HEADER), self.user.clone());
            headers.insert(
                HeaderName::from_static(TOKEN_HEADER),
                HeaderValue::from(token),
            );
        }
        request
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamped(stamp: &Stamp) -> Request<()> {
        stamp.apply(Request::new(()))
    }

    #[test]
    fn a_request_carries_the_current_token_and_the_own_username() {
        let cell = TokenCell::default();
        let stamp = Stamp::new("system:serviceaccount:ops:op", cell.clone()).unwrap();
        assert!(
            stamped(&stamp).headers().is_empty(),
            "no token yet: unstamped"
        );
        cell.set(42);
        let request = stamped(&stamp);
        assert_eq!(
            request.headers()[USER_HEADER],
            "system:serviceaccount:ops:op"
        );
        assert_eq!(request.headers()[TOKEN_HEADER], "42");
        cell.set(43);
        assert_eq!(stamped(&stamp).headers()[TOKEN_HEADER], "43");
    }

    #[test]
    fn the_header_names_the_extra_the_policy_reads() {
        let escaped = TOKEN_HEADER.strip_prefix("impersonate-extra-").unwrap();
        assert_eq!(escaped.replace("%2f", "/"), TOKEN_EXTRA);
    }
}
