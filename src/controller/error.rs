//! The controller's error type: a failed API call, classified once by
//! [`ApiErrorKind`], with a low-cardinality [`Error::label`]. (The election has its
//! own, `election::ElectionError`.)

use crate::kube_error::ApiErrorKind;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A call to the API server failed; `call` says which (a fixed phrase).
    #[error("{call}: {source}")]
    Api {
        call: &'static str,
        kind: ApiErrorKind,
        #[source]
        source: kube::Error,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// A failed API call, classified.
    pub fn api(call: &'static str, source: kube::Error) -> Self {
        Error::Api {
            call,
            kind: ApiErrorKind::of(&source),
            source,
        }
    }

    /// What the API server answered, for a failed call.
    pub fn kind(&self) -> Option<ApiErrorKind> {
        match self {
            Error::Api { kind, .. } => Some(*kind),
        }
    }

    /// True for a failed call that ended with one of `kinds`.
    pub fn is(&self, kinds: &[ApiErrorKind]) -> bool {
        self.kind().is_some_and(|k| kinds.contains(&k))
    }

    /// The metrics and log label: one of a fixed set of short words.
    pub fn label(&self) -> &'static str {
        match self {
            Error::Api { kind, .. } => kind.label(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: u16) -> kube::Error {
        crate::kube_error::refusal(code, "test")
    }

    #[test]
    fn a_failed_call_is_classified_once_and_labelled_by_its_kind() {
        let e = Error::api("replace Lease status", status(409));
        assert_eq!(e.kind(), Some(ApiErrorKind::Conflict));
        assert!(e.is(&[ApiErrorKind::NotFound, ApiErrorKind::Conflict]));
        assert!(!e.is(&[ApiErrorKind::Invalid]));
        assert_eq!(e.label(), "conflict");
        assert!(e.to_string().starts_with("replace Lease status: "), "{e}");
        assert_eq!(Error::api("get Pod", status(503)).label(), "transient");
    }
}
