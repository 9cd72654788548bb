//! Parsing the `Idempotency-Key` header.
//!
//! The draft defines the value as a Structured Field string (`"abc"`); many
//! clients (Stripe's among them) send it bare. Both are accepted.

use axum::http::HeaderMap;

/// Longest accepted key, in bytes.
pub const MAX_KEY_LEN: usize = 255;

/// A validated idempotency key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyKey(pub String);

/// Why a key was rejected (each maps to 400).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// The header is absent.
    #[error("the Idempotency-Key header is required")]
    Missing,
    /// Empty, too long, or not printable ASCII.
    #[error("the Idempotency-Key header must be 1..={MAX_KEY_LEN} printable ASCII characters")]
    Invalid,
}

impl IdempotencyKey {
    /// Reads and validates the key from `headers`.
    pub fn from_headers(headers: &HeaderMap) -> Result<Self, KeyError> {
        let raw = headers.get("idempotency-key").ok_or(KeyError::Missing)?;
        let s = raw.to_str().map_err(|_| KeyError::Invalid)?.trim();
        let s = s.strip_prefix('"').and_then(|r| r.strip_suffix('"')).unwrap_or(s);
        let printable = s.bytes().all(|b| (0x21..=0x7e).contains(&b) && b != b'"');
        if s.is_empty() || s.len() > MAX_KEY_LEN || !printable {
            return Err(KeyError::Invalid);
        }
        Ok(Self(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(v: &str) -> Result<IdempotencyKey, KeyError> {
        let mut h = HeaderMap::new();
        h.insert("idempotency-key", v.parse().unwrap());
        IdempotencyKey::from_headers(&h)
    }

    #[test]
    fn accepts_bare_and_quoted() {
        assert_eq!(parse("abc-1").unwrap().0, "abc-1");
        assert_eq!(parse("\"abc-1\"").unwrap().0, "abc-1");
        let longest = "k".repeat(MAX_KEY_LEN);
        assert_eq!(parse(&longest).unwrap().0, longest);
    }

    #[test]
    fn rejects_missing_empty_long_and_spaces() {
        assert_eq!(IdempotencyKey::from_headers(&HeaderMap::new()), Err(KeyError::Missing));
        assert_eq!(parse("\"\""), Err(KeyError::Invalid));
        assert_eq!(parse(&"k".repeat(MAX_KEY_LEN + 1)), Err(KeyError::Invalid));
        assert_eq!(parse("a b"), Err(KeyError::Invalid));
    }
}
