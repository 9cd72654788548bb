//! The deployment secrets of a stack, fresh and random for each one (as
//! docker/gen-env.sh makes them for compose): no service starts without
//! its own.

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
    /// inventory-service's operator credential (stock endpoints, its
    /// admin records).
    pub operator: String,
    /// order-api's operator credential (the journey on its admin port).
    pub order_api_operator: String,
    /// payment-service's operator credential (its admin records).
    pub payment_operator: String,
    /// order-api's credential at the participants' admin records (their
    /// `ADMIN_READERS`).
    pub order_api_reader: String,
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
            order_api_operator: s(),
            payment_operator: s(),
            order_api_reader: s(),
        }
    }

    /// As a file of `NAME=value` lines (docker/gen-env.sh's names).
    pub fn to_env_file(&self) -> String {
        self.fields()
            .iter()
            .map(|(name, value)| format!("{name}={value}\n"))
            .collect()
    }

    /// Reads [`Self::to_env_file`]'s format back; None when a name is
    /// missing, except the admin ports' credentials, added later: a file
    /// from before them gets fresh ones (its keys that fingerprint stored
    /// data are kept).
    pub fn from_env_file(text: &str) -> Option<Self> {
        let get = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix('='))
                .map(|v| v.trim().to_owned())
                .filter(|v| v.len() >= 32)
        };
        let fresh = Self::generate();
        Some(Self {
            vault: get("GATEWAY_VAULT_KEY")?,
            order_api_fingerprint: get("ORDER_API_FINGERPRINT_KEY")?,
            gateway_fingerprint: get("GATEWAY_FINGERPRINT_KEY")?,
            order_api_gateway: get("ORDER_API_GATEWAY_KEY")?,
            payment_gateway: get("PAYMENT_GATEWAY_KEY")?,
            operator: get("INVENTORY_OPERATOR_KEY")?,
            order_api_operator: get("ORDER_API_OPERATOR_KEY").unwrap_or(fresh.order_api_operator),
            payment_operator: get("PAYMENT_OPERATOR_KEY").unwrap_or(fresh.payment_operator),
            order_api_reader: get("ORDER_API_READER_KEY").unwrap_or(fresh.order_api_reader),
        })
    }

    fn fields(&self) -> [(&'static str, &str); 9] {
        [
            ("GATEWAY_VAULT_KEY", &self.vault),
            ("ORDER_API_FINGERPRINT_KEY", &self.order_api_fingerprint),
            ("GATEWAY_FINGERPRINT_KEY", &self.gateway_fingerprint),
            ("ORDER_API_GATEWAY_KEY", &self.order_api_gateway),
            ("PAYMENT_GATEWAY_KEY", &self.payment_gateway),
            ("INVENTORY_OPERATOR_KEY", &self.operator),
            ("ORDER_API_OPERATOR_KEY", &self.order_api_operator),
            ("PAYMENT_OPERATOR_KEY", &self.payment_operator),
            ("ORDER_API_READER_KEY", &self.order_api_reader),
        ]
    }

    /// A participant's `ADMIN_READERS`: order-api, for the journey.
    fn readers(&self) -> String {
        format!("order-api={}", self.order_api_reader)
    }

    /// The operator's credential for `s`'s admin records (None: it has none).
    pub fn operator_of(&self, s: Service) -> Option<&str> {
        match s {
            Service::OrderApi => Some(&self.order_api_operator),
            Service::Inventory => Some(&self.operator),
            Service::Payment => Some(&self.payment_operator),
            _ => None,
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
                pair("OPERATOR_KEY", &self.order_api_operator),
                pair("PARTICIPANTS_ADMIN_KEY", &self.order_api_reader),
            ],
            Service::Payment => vec![
                pair("GATEWAY_API_KEY", &self.payment_gateway),
                pair("OPERATOR_KEY", &self.payment_operator),
                pair("ADMIN_READERS", &self.readers()),
            ],
            Service::Inventory => vec![
                pair("OPERATOR_KEY", &self.operator),
                pair("ADMIN_READERS", &self.readers()),
            ],
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

    /// The API key of [`crate::stack::DRIVER_CLIENT`].
    pub fn api_key(&self) -> &str {
        &self.api_key
    }

    /// The services' secrets (operator and gateway credentials for tests).
    pub fn secrets(&self) -> &Secrets {
        &self.secrets
    }
}

#[cfg(test)]
mod tests {
    use super::Secrets;

    #[test]
    fn the_env_file_round_trips_and_names_what_compose_reads() {
        let s = Secrets::generate();
        let text = s.to_env_file();
        let back = Secrets::from_env_file(&text).expect("reads back");
        assert_eq!(back.to_env_file(), text);
        let gen = include_str!("../../../docker/gen-env.sh");
        for line in text.lines() {
            let name = line.split('=').next().unwrap();
            assert!(gen.contains(&format!("echo \"{name}=")), "gen-env.sh lacks {name}");
        }
        assert!(Secrets::from_env_file("GATEWAY_VAULT_KEY=short").is_none());
        // A file written before the admin credentials: those are new, the rest kept.
        let old: String = text.lines().take(6).map(|l| format!("{l}\n")).collect();
        let upgraded = Secrets::from_env_file(&old).expect("an older file reads");
        assert_eq!(upgraded.vault, s.vault);
        assert_ne!(upgraded.order_api_operator, s.order_api_operator);
    }
}
