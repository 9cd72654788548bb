//! The attacker's side of PCI DSS 3.5: a stored hash of a card number is
//! worthless only if it cannot be tested against guesses. Knowing a card's
//! BIN (its first six digits, public per issuer) and its last four (shown
//! by the API), the 16-digit numbers that fit are 10^6, 10^5 of them
//! Luhn-valid; an unkeyed hash of each is a second of work. This module
//! tries them against every 64-hex value stored anywhere, with every
//! derivation an attacker without the deployment's secrets can compute.

use std::collections::BTreeSet;

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

/// The order fields an attacker reads from a stored response next to the
/// fingerprint (all but the card).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Seen {
    pub sku: String,
    pub quantity: i64,
    pub amount_cents: i64,
    pub last4: String,
}

/// Every 64-hex-character token in `text`.
pub fn hex64(text: &str) -> BTreeSet<String> {
    text.split(|c: char| !c.is_ascii_hexdigit())
        .filter(|t| t.len() == 64)
        .map(str::to_ascii_lowercase)
        .collect()
}

fn luhn_ok(digits: &[u8]) -> bool {
    let sum: u32 = digits
        .iter()
        .rev()
        .enumerate()
        .map(|(i, &d)| {
            let d = u32::from(d - b'0');
            if i % 2 == 1 {
                let x = d * 2;
                if x > 9 {
                    x - 9
                } else {
                    x
                }
            } else {
                d
            }
        })
        .sum();
    sum.is_multiple_of(10)
}

/// The Luhn-valid 16-digit numbers with `bin` and `last4`.
pub fn candidates<'a>(bin: &'a str, last4: &'a str) -> impl Iterator<Item = String> + 'a {
    (0..1_000_000u32)
        .map(move |middle| format!("{bin}{middle:06}{last4}"))
        .filter(|n| luhn_ok(n.as_bytes()))
}

fn sha256_hex(parts: &[&[u8]]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p);
    }
    hex::encode(h.finalize())
}

/// What an attacker computes for one guess: the number's plain hash, an
/// HMAC under the vault key the gateway once defaulted to, and for every
/// order seen the unkeyed request fingerprint (method, path, canonical
/// body — keys sorted, or in the client's order).
fn derivations(card: &str, seen: &[Seen]) -> Vec<String> {
    let mut out = vec![sha256_hex(&[card.as_bytes()])];
    let mut mac = Hmac::<Sha256>::new_from_slice(b"development-vault-key").expect("any key length");
    mac.update(card.as_bytes());
    out.push(hex::encode(mac.finalize().into_bytes()));
    for s in seen {
        let sorted = format!(
            r#"{{"amount_cents":{},"card":"{card}","quantity":{},"sku":{}}}"#,
            s.amount_cents,
            s.quantity,
            serde_json::to_string(&s.sku).expect("string")
        );
        let sent = format!(
            r#"{{"sku":{},"quantity":{},"amount_cents":{},"card":"{card}"}}"#,
            serde_json::to_string(&s.sku).expect("string"),
            s.quantity,
            s.amount_cents
        );
        for body in [sorted, sent] {
            out.push(sha256_hex(&[b"POST\0/orders\0", body.as_bytes()]));
        }
    }
    out
}

/// Tries every candidate of `bin` + each seen last four against `stored`;
/// returns the numbers whose derivation was found, and how many were tried.
pub fn recover(bin: &str, seen: &[Seen], stored: &BTreeSet<String>) -> (Vec<String>, usize) {
    let last4s: BTreeSet<&str> = seen.iter().map(|s| s.last4.as_str()).collect();
    let (mut found, mut tried) = (Vec::new(), 0);
    for last4 in last4s {
        let orders: Vec<Seen> = seen.iter().filter(|s| s.last4 == last4).cloned().collect();
        for card in candidates(bin, last4) {
            tried += 1;
            if derivations(&card, &orders).iter().any(|d| stored.contains(d)) {
                found.push(card);
            }
        }
    }
    (found, tried)
}

#[test]
fn the_brute_force_finds_a_card_behind_an_unkeyed_fingerprint() {
    // The check of the check: a fingerprint computed as before the fix
    // (unkeyed) is found, a keyed one is not.
    let seen = [Seen {
        sku: "WIDGET".into(),
        quantity: 1,
        amount_cents: 300,
        last4: "4242".into(),
    }];
    let body = r#"{"amount_cents":300,"card":"4242424242424242","quantity":1,"sku":"WIDGET"}"#;
    let unkeyed = sha256_hex(&[b"POST\0/orders\0", body.as_bytes()]);
    let (found, tried) = recover("424242", &seen, &BTreeSet::from([unkeyed]));
    assert_eq!(found, ["4242424242424242"]);
    assert_eq!(tried, 100_000, "the Luhn-valid tenth of 10^6");
    let mut mac = Hmac::<Sha256>::new_from_slice(b"a deployment secret of 32 bytes!").unwrap();
    mac.update(b"POST\0/orders\0");
    mac.update(body.as_bytes());
    let keyed = hex::encode(mac.finalize().into_bytes());
    assert!(recover("424242", &seen, &BTreeSet::from([keyed])).0.is_empty());
}
