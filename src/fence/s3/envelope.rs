//! The envelope of a fenced object: one header line before the payload,
//!
//! ```text
//! palisade-fence/1 token=1841 write=5f0c2b9e4d7a16c3a8e1f09b2d6c4e7a\n<payload bytes>
//! ```
//!
//! so that the stored bytes, and with them the ETag (the MD5 of the bytes for a
//! single-part PUT), differ for every write: an ETag never comes back, and an `If-Match`
//! read before a newer write can never match again (the module docs of
//! [`super`] say why that matters). The write id is 128 bits that no other write
//! shares; the token is the decimal fencing token, also in the object's metadata.

use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

/// The first bytes of every fenced object; a version bump changes them.
pub const MAGIC: &str = "palisade-fence/1";
/// The longest header line that [`unwrap`] looks for (magic, token, write id).
const MAX_HEADER: usize = 128;

/// The stored bytes of a write: the header line, then `payload`.
pub fn wrap(token: u64, write_id: &str, payload: &[u8]) -> Vec<u8> {
    let header = format!("{MAGIC} token={token} write={write_id}\n");
    let mut bytes = Vec::with_capacity(header.len() + payload.len());
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend_from_slice(payload);
    bytes
}

/// A fenced object's stored bytes, taken apart.
#[derive(Debug, PartialEq, Eq)]
pub struct Unwrapped<'a> {
    pub token: u64,
    pub write_id: &'a str,
    pub payload: &'a [u8],
}

/// Why bytes are not a fenced object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotFenced {
    /// They do not start with [`MAGIC`]: written by something else.
    Missing,
    /// They start with [`MAGIC`], but the header line is damaged.
    Damaged(String),
}

/// Takes the header line off.
pub fn unwrap(bytes: &[u8]) -> Result<Unwrapped<'_>, NotFenced> {
    if !bytes.starts_with(format!("{MAGIC} ").as_bytes()) {
        return Err(NotFenced::Missing);
    }
    let damaged = |what: &str| NotFenced::Damaged(format!("the {MAGIC} header line {what}"));
    let end = bytes
        .iter()
        .take(MAX_HEADER)
        .position(|&b| b == b'\n')
        .ok_or_else(|| damaged("has no end"))?;
    let header = std::str::from_utf8(&bytes[..end]).map_err(|_| damaged("is not UTF-8"))?;
    let mut fields = header.split(' ').skip(1);
    let token = fields
        .next()
        .and_then(|f| f.strip_prefix("token="))
        .and_then(|t| t.parse::<u64>().ok())
        .ok_or_else(|| damaged("has no valid token"))?;
    let write_id = fields
        .next()
        .and_then(|f| f.strip_prefix("write="))
        .filter(|id| !id.is_empty())
        .ok_or_else(|| damaged("has no write id"))?;
    if fields.next().is_some() {
        return Err(damaged("has extra fields"));
    }
    Ok(Unwrapped {
        token,
        write_id,
        payload: &bytes[end + 1..],
    })
}

/// 128 bits no other write shares: the process's random hash keys (fresh per process)
/// over the time, the process id and a counter.
pub fn write_id() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let count = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let half = |salt: u64| {
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_u64(salt);
        hasher.write_u128(nanos);
        hasher.write_u32(std::process::id());
        hasher.write_u64(count);
        hasher.finish()
    };
    format!("{:016x}{:016x}", half(1), half(2))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrap_and_unwrap_round_trip() {
        let bytes = wrap(1841, "abc", b"credit 10\nline two");
        let unwrapped = unwrap(&bytes).unwrap();
        assert_eq!(
            unwrapped,
            Unwrapped {
                token: 1841,
                write_id: "abc",
                payload: b"credit 10\nline two",
            }
        );
        assert_eq!(unwrap(&wrap(7, "x", b"")).unwrap().payload, b"");
    }

    #[test]
    fn unfenced_or_damaged_bytes_are_refused() {
        for bytes in [
            &b"plain object"[..],
            b"plain\nobject",
            b"palisade-fence/2 token=5 write=x\n",
        ] {
            assert_eq!(unwrap(bytes), Err(NotFenced::Missing));
        }
        for bytes in [
            &b"palisade-fence/1 token=abc write=x\n"[..],
            b"palisade-fence/1 token=5 write=x",
            b"palisade-fence/1 token=5\n",
            b"palisade-fence/1 token=5 write=x extra\n",
        ] {
            let damaged = matches!(unwrap(bytes), Err(NotFenced::Damaged(_)));
            assert!(damaged, "{:?}", String::from_utf8_lossy(bytes));
        }
    }

    #[test]
    fn write_ids_differ() {
        let ids: std::collections::HashSet<String> = (0..1000).map(|_| write_id()).collect();
        assert_eq!(ids.len(), 1000);
        assert!(ids.iter().all(|id| id.len() == 32));
    }
}
