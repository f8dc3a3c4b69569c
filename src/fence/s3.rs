//! Fencing in S3-compatible object stores: an object written only if its token is not
//! below the token recorded on the object (work in progress).
