//! Credentials: the deployment secrets read from the environment that key a
//! hash or authenticate a caller, compared in constant time, and the
//! [`Scope`] an authenticated request carries. A [`Secret`] has no default — a service without
//! one refuses to start and names the variable (clap's required argument) —
//! is at least [`Secret::MIN_LEN`] bytes, and never prints.

/// The crate's README, compiled and run as documentation tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

use std::sync::Arc;

/// A secret value. `Debug` and `Display` print `[redacted]`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Arc<str>);

impl Secret {
    /// Shortest accepted secret, in bytes (128 bits as hex).
    pub const MIN_LEN: usize = 32;

    /// A secret of `value`; refused when shorter than [`Self::MIN_LEN`].
    pub fn new(value: &str) -> Result<Self, String> {
        if value.len() < Self::MIN_LEN {
            return Err(format!(
                "a secret is at least {} characters (generate one with `openssl rand -hex 32`)",
                Self::MIN_LEN
            ));
        }
        Ok(Self(Arc::from(value)))
    }

    /// The value, for keying a MAC or comparing a presented credential.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::str::FromStr for Secret {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Self::new(s)
    }
}

impl clap::builder::ValueParserFactory for Secret {
    type Parser = SecretParser<Secret>;

    fn value_parser() -> Self::Parser {
        SecretParser::default()
    }
}

/// Parses a value holding secrets with `T::from_str`; a refusal names the
/// argument (and its variable) and the reason, never the value — clap's
/// own errors quote the value they refused.
pub struct SecretParser<T>(std::marker::PhantomData<fn() -> T>);

impl<T> Default for SecretParser<T> {
    fn default() -> Self {
        Self(std::marker::PhantomData)
    }
}

impl<T> Clone for SecretParser<T> {
    fn clone(&self) -> Self {
        Self::default()
    }
}

impl<T> clap::builder::TypedValueParser for SecretParser<T>
where
    T: std::str::FromStr<Err = String> + Clone + Send + Sync + 'static,
{
    type Value = T;

    fn parse_ref(
        &self,
        _cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<T, clap::Error> {
        let name = arg.map_or_else(
            || "a secret".to_owned(),
            |a| match (a.get_long(), a.get_env()) {
                (Some(long), Some(env)) => format!("--{long} ({})", env.to_string_lossy()),
                (Some(long), None) => format!("--{long}"),
                _ => a.get_id().to_string(),
            },
        );
        let text = value
            .to_str()
            .ok_or_else(|| clap::Error::raw(clap::error::ErrorKind::InvalidUtf8, format!("{name} is not UTF-8\n")))?;
        text.parse().map_err(|reason: String| {
            clap::Error::raw(
                clap::error::ErrorKind::ValueValidation,
                format!("invalid value for {name} (not shown): {reason}\n"),
            )
        })
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("[redacted]")
    }
}

impl std::fmt::Display for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("[redacted]")
    }
}

/// Whether `a` and `b` are equal, in time independent of where they differ
/// (`subtle`'s constant-time comparison of their SHA-256 digests, so their
/// lengths leak nothing either).
pub fn constant_time_eq(a: &str, b: &str) -> bool {
    use sha2::{Digest as _, Sha256};
    use subtle::ConstantTimeEq as _;
    Sha256::digest(a.as_bytes()).ct_eq(&Sha256::digest(b.as_bytes())).into()
}

/// The authenticated caller of a request, put in its extensions by the
/// service's authentication — the API key's client, or the gateway
/// credential's caller. A caller cannot name another's scope (there is no
/// header for it); what it may do is decided from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scope(pub String);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_secret_is_refused_and_none_prints() {
        assert!(Secret::new("short").is_err());
        let s = Secret::new(&"k".repeat(32)).unwrap();
        assert_eq!(format!("{s} {s:?}"), "[redacted] [redacted]");
        assert_eq!(s.expose(), "k".repeat(32));
    }

    #[test]
    fn equality_without_early_exit() {
        assert!(constant_time_eq("abc", "abc"));
        assert!(!constant_time_eq("abc", "abd"));
        assert!(!constant_time_eq("abc", "abcd"));
        // Digests whose byte differences XOR to zero ("k0" and "k8"): a
        // hand-written accumulator that XORed instead of ORed called them equal.
        assert!(!constant_time_eq("k0", "k8"));
    }

    /// Two secret arguments, one with a variable (built by hand: a test's
    /// variable is no setting for docs/operations.md to list).
    fn cli() -> clap::Command {
        let secret = || clap::Arg::new("").value_parser(clap::value_parser!(Secret));
        clap::Command::new("t")
            .arg(secret().id("with_env").long("with-env").env("EO_TEST_SECRET"))
            .arg(secret().id("bare").long("bare"))
    }

    #[test]
    fn a_refused_secret_is_named_by_its_flag_and_variable_never_shown() {
        let long = "s".repeat(32);
        let ok = cli().try_get_matches_from(["t", "--bare", &long]).unwrap();
        assert_eq!(ok.get_one::<Secret>("bare").unwrap().expose(), long);
        let e = cli()
            .try_get_matches_from(["t", "--with-env", "tiny-secret"])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--with-env (EO_TEST_SECRET)") && !e.contains("tiny-secret"),
            "{e}"
        );
        let e = cli()
            .try_get_matches_from(["t", "--bare", "tiny-secret"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("--bare (not shown)") && !e.contains("tiny-secret"), "{e}");
        // clap clones the parser of an argument when it builds the command.
        let parser = <Secret as clap::builder::ValueParserFactory>::value_parser();
        let cmd = clap::Command::new("t");
        let value = clap::builder::TypedValueParser::parse_ref(&parser.clone(), &cmd, None, "tiny".as_ref());
        assert!(value.unwrap_err().to_string().contains("a secret (not shown)"));
    }
}
