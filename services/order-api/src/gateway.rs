//! What order-api asks the payment gateway directly: a card's token (so no
//! card number is ever stored or sent on), and — when an order's payment is
//! overdue — what the gateway did under the operation's key; and the
//! notifier beside it, which takes confirmation notices without a key.
//! Charges and refunds themselves are payment-service's.

use std::time::Duration;

use hmac::{Hmac, Mac as _};
use sha2::Sha256;

/// The gateway caller whose operations order-api's reconciliation reads
/// (payment-service's keys; the gateway grants order-api that read with
/// `GATEWAY_READERS=order-api=payment-service`).
pub const PAYMENT_CLIENT: &str = "payment-service";

pub use gateway_client::api::{CardToken, Operation};
pub use gateway_client::Error;

/// Cards this process has tokenised, by an HMAC-SHA256 of the number under
/// a key drawn at start and never stored (a plain hash of a card number is
/// undone by trying the few billion numbers a card can have): the vault
/// gives a card the same token every time, so a repeat card needs no call
/// (and `POST /orders` for it works while the vault is down). In memory
/// only; bounded by [`TOKEN_CACHE_SIZE`] (the least used go).
type TokenCache = moka::sync::Cache<[u8; 32], CardToken>;

/// Cards remembered per process.
pub const TOKEN_CACHE_SIZE: u64 = 10_000;

/// The gateway client (`gateway_client::Client`, the one payment-service
/// uses too), with this process's token cache.
#[derive(Clone)]
pub struct Client {
    gateway: gateway_client::Client,
    tokens: TokenCache,
    /// The key of the cache's card digests.
    digest_key: std::sync::Arc<[u8; 32]>,
}

impl Client {
    /// A client for `base` presenting credential `key`, with a per-request
    /// `timeout`.
    pub fn new(base: &str, key: &service_kit::Secret, timeout: Duration) -> anyhow::Result<Self> {
        Ok(Self::over(gateway_client::Client::new(base, key.expose(), timeout)?))
    }

    /// This process's cache over `gateway` (as `GatewayArgs::client` builds
    /// it: https, the gateway's CA).
    pub fn over(gateway: gateway_client::Client) -> Self {
        Self {
            gateway,
            tokens: TokenCache::new(TOKEN_CACHE_SIZE),
            digest_key: std::sync::Arc::new(rand::random()),
        }
    }

    /// The token of `card` (`POST /v1/tokens`, unless this process has
    /// tokenised the card before).
    pub async fn tokenise(&self, card: &str) -> Result<CardToken, Error> {
        let digest = self.digest(card);
        if let Some(known) = self.tokens.get(&digest) {
            return Ok(known);
        }
        let token = self.gateway.tokenise(card).await?;
        self.tokens.insert(digest, token.clone());
        Ok(token)
    }

    /// `card`'s token, if this process has it already (no vault call for it).
    pub fn cached(&self, card: &str) -> Option<CardToken> {
        self.tokens.get(&self.digest(card))
    }

    /// The cache's key of `card`: its HMAC-SHA256 under this process's key.
    fn digest(&self, card: &str) -> [u8; 32] {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.digest_key[..]).expect("HMAC takes any key");
        mac.update(card.as_bytes());
        mac.finalize().into_bytes().into()
    }

    /// Sends the confirmation notice of `order` to the notifier (no key:
    /// each call is one more notice; `crate::notices` says who calls it when).
    pub async fn notify(&self, order: uuid::Uuid) -> Result<(), Error> {
        let notice = gateway_client::api::NoticeRequest {
            order_id: order,
            text: format!("Your order {order} is confirmed."),
        };
        self.gateway.notify(&notice).await
    }

    /// What the gateway committed under payment-service's key `key`
    /// (`GET /v1/operations/{key}?client=payment-service`): `None` when
    /// nothing was.
    pub async fn lookup(&self, key: &str) -> Result<Option<Operation>, Error> {
        self.gateway.lookup(key, Some(PAYMENT_CLIENT)).await
    }
}

#[cfg(test)]
mod tests {
    use super::Client;
    use sha2::{Digest as _, Sha256};

    #[test]
    fn a_card_is_cached_under_a_keyed_digest_no_other_process_can_recompute() {
        let key = service_kit::Secret::new(&"k".repeat(40)).unwrap();
        let a = Client::new("http://127.0.0.1:9", &key, std::time::Duration::from_secs(1)).unwrap();
        let b = Client::new("http://127.0.0.1:9", &key, std::time::Duration::from_secs(1)).unwrap();
        let card = "4242424242424242";
        assert_eq!(a.digest(card), a.digest(card), "one process, one key");
        assert_ne!(a.digest(card), b.digest(card), "each process draws its own key");
        let plain: [u8; 32] = Sha256::digest(card.as_bytes()).into();
        assert_ne!(a.digest(card), plain, "not the plain hash anyone can compute");
    }
}
