//! The deployment secrets of a stack, fresh and random for each one (as
//! `cargo xtask secrets` makes them for compose): no service starts
//! without its own.

use super::{Service, Stack};

/// Every secret the services need.
#[derive(Clone)]
pub struct Secrets {
    /// The vault's card-fingerprint key (mock-gateway).
    pub vault: String,
    /// order-api's Idempotency-Key fingerprint key.
    pub order_api_fingerprint: String,
    /// mock-gateway's Idempotency-Key fingerprint key.
    pub gateway_fingerprint: String,
    /// order-api's credential at the gateway.
    pub order_api_gateway: String,
    /// payment-service's credential at the gateway.
    pub payment_gateway: String,
    /// inventory-service's operator credential (stock endpoints).
    pub operator: String,
}

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secrets([redacted])")
    }
}

impl Secrets {
    /// Fresh random secrets.
    pub fn generate() -> Self {
        // 256 random bits as 64 hex characters.
        let s = || format!("{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple());
        Self {
            vault: s(),
            order_api_fingerprint: s(),
            gateway_fingerprint: s(),
            order_api_gateway: s(),
            payment_gateway: s(),
            operator: s(),
        }
    }

    /// The environment that gives service `s` its secrets.
    pub fn env(&self, s: Service) -> Vec<(String, String)> {
        let pair = |k: &str, v: &str| (k.to_owned(), v.to_owned());
        match s {
            Service::Gateway => vec![
                pair("GATEWAY_VAULT_KEY", &self.vault),
                pair("IDEMPOTENCY_FINGERPRINT_KEY", &self.gateway_fingerprint),
                pair(
                    "GATEWAY_CLIENTS",
                    &format!(
                        "order-api={},payment-service={}",
                        self.order_api_gateway, self.payment_gateway
                    ),
                ),
                pair("GATEWAY_READERS", "order-api=payment-service"),
            ],
            Service::OrderApi => vec![
                pair("IDEMPOTENCY_FINGERPRINT_KEY", &self.order_api_fingerprint),
                pair("GATEWAY_API_KEY", &self.order_api_gateway),
            ],
            Service::Payment => vec![pair("GATEWAY_API_KEY", &self.payment_gateway)],
            Service::Inventory => vec![pair("INVENTORY_OPERATOR_KEY", &self.operator)],
            Service::Broker | Service::Relay => Vec::new(),
        }
    }
}

/// Credentials of a running stack.
impl Stack {
    /// Provisions an API key for `client` (as `order-api keys create` does).
    pub async fn create_api_key(&self, client: &str) -> anyhow::Result<String> {
        let pool = sqlx::PgPool::connect(&self.db_url("orders")).await?;
        let (_, key) = order_api::auth::create_key(&pool, client).await?;
        pool.close().await;
        Ok(key)
    }

    /// The API key of [`DRIVER_CLIENT`].
    pub fn api_key(&self) -> &str {
        &self.api_key
    }

    /// The services' secrets (operator and gateway credentials for tests).
    pub fn secrets(&self) -> &Secrets {
        &self.secrets
    }
}
