//! What an API server failure means to us, decided in one place.
//!
//! Every caller used to match status codes by hand (409 here, 404 or 422 there, 429 and
//! 5xx somewhere else); [`ApiErrorKind::of`] names the answer once, and its
//! [`label`](ApiErrorKind::label) is the low-cardinality value metrics and logs use.

/// The kinds of failure a call to the API server ends with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ApiErrorKind {
    /// 409: a precondition (resourceVersion or UID) failed, or the name exists.
    Conflict,
    /// 404: the object is gone.
    NotFound,
    /// 422: the object was refused as invalid, including a failed JSON-patch `test` (our
    /// UID and resourceVersion guards).
    Invalid,
    /// 400: the request was refused; admission webhooks refuse with 400 by default, so
    /// this says nothing about whether the object still exists.
    BadRequest,
    /// 401 or 403: the caller may not do this.
    Forbidden,
    /// 410: the resourceVersion asked for is older than the server keeps.
    Expired,
    /// 429 or 5xx, or no answer at all (connection, TLS, stream): worth retrying.
    Transient,
    /// Anything else (a response we could not decode, a bad request we built).
    Other,
}

impl ApiErrorKind {
    pub fn of(e: &kube::Error) -> Self {
        match e {
            kube::Error::Api(s) => match s.code {
                409 => Self::Conflict,
                404 => Self::NotFound,
                422 => Self::Invalid,
                400 => Self::BadRequest,
                401 | 403 => Self::Forbidden,
                410 => Self::Expired,
                429 | 500..=599 => Self::Transient,
                _ => Self::Other,
            },
            kube::Error::HyperError(_) | kube::Error::Service(_) | kube::Error::ReadEvents(_) => {
                Self::Transient
            }
            _ => Self::Other,
        }
    }

    /// The metrics and log label: one of a fixed set of short words.
    pub fn label(self) -> &'static str {
        match self {
            Self::Conflict => "conflict",
            Self::NotFound => "not_found",
            Self::Invalid => "invalid",
            Self::BadRequest => "bad_request",
            Self::Forbidden => "forbidden",
            Self::Expired => "expired",
            Self::Transient => "transient",
            Self::Other => "other",
        }
    }

    pub fn is_transient(self) -> bool {
        self == Self::Transient
    }
}

/// The error a refusal with status `code` becomes, as kube returns it: for unit tests and
/// model servers that answer like the API server.
#[doc(hidden)]
pub fn refusal(code: u16, message: &str) -> kube::Error {
    kube::Error::Api(
        kube::core::Status::failure(message, "Refused")
            .with_code(code)
            .boxed(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: u16) -> kube::Error {
        refusal(code, "test")
    }

    #[test]
    fn status_codes_map_to_their_kinds() {
        let cases = [
            (409, ApiErrorKind::Conflict),
            (404, ApiErrorKind::NotFound),
            (422, ApiErrorKind::Invalid),
            (400, ApiErrorKind::BadRequest),
            (403, ApiErrorKind::Forbidden),
            (401, ApiErrorKind::Forbidden),
            (410, ApiErrorKind::Expired),
            (429, ApiErrorKind::Transient),
            (500, ApiErrorKind::Transient),
            (503, ApiErrorKind::Transient),
            (418, ApiErrorKind::Other),
        ];
        for (code, kind) in cases {
            assert_eq!(ApiErrorKind::of(&status(code)), kind, "status {code}");
        }
    }

    #[test]
    fn labels_are_distinct() {
        let kinds = [
            ApiErrorKind::Conflict,
            ApiErrorKind::NotFound,
            ApiErrorKind::Invalid,
            ApiErrorKind::BadRequest,
            ApiErrorKind::Forbidden,
            ApiErrorKind::Expired,
            ApiErrorKind::Transient,
            ApiErrorKind::Other,
        ];
        let labels: std::collections::HashSet<_> = kinds.iter().map(|k| k.label()).collect();
        assert_eq!(labels.len(), kinds.len());
    }
}
