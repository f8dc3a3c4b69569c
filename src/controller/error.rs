//! The controller side's one error type: a failed API call (classified once by
//! [`ApiErrorKind`]) or a lost election, each with a low-cardinality [`Error::label`].

use std::time::Duration;

use crate::error::ApiErrorKind;

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
    /// Another replica holds the election lease now.
    #[error("another replica took the election lease")]
    ElectionLost,
    /// The election lease could not be renewed within the renew deadline.
    #[error("could not renew the election lease within {0:?}")]
    RenewDeadline(Duration),
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
            _ => None,
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
            Error::ElectionLost => "election_lost",
            Error::RenewDeadline(_) => "renew_deadline",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: u16) -> kube::Error {
        crate::error::refusal(code, "test")
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

    #[test]
    fn election_failures_have_their_own_labels() {
        assert_eq!(Error::ElectionLost.label(), "election_lost");
        assert_eq!(Error::ElectionLost.kind(), None);
        let e = Error::RenewDeadline(Duration::from_secs(10));
        assert_eq!(e.label(), "renew_deadline");
        assert_eq!(
            e.to_string(),
            "could not renew the election lease within 10s"
        );
    }
}
