//! `cargo xtask bench --instances N`: every consumer service (inventory,
//! payment, order-api's saga) runs as N instances in its consumer group,
//! and the report says how much each instance handled — the figure that
//! shows the partitions were shared rather than the work done twice.

use std::time::Duration;

use serde::Serialize;

use crate::stack::{Service, Stack};

/// The consumer services and the topic each consumes.
pub const CONSUMERS: [(Service, &str); 3] = [
    (Service::Inventory, contract::topics::INVENTORY_COMMANDS),
    (Service::Payment, contract::topics::PAYMENT_COMMANDS),
    (Service::OrderApi, contract::topics::ORDER_EVENTS),
];

/// One running instance of a consumer service.
#[derive(Debug, Clone, Serialize)]
pub struct Instance {
    /// The service.
    pub service: String,
    /// Its admin URL (metrics).
    pub url: String,
    /// The partitions its group gave it when the run started.
    pub partitions: usize,
    /// Events it applied over the run (`consumer_events_applied_total`).
    pub applied: f64,
    /// Redelivered events its inbox absorbed (`consumer_duplicates_absorbed_total`).
    pub duplicates: f64,
}

/// Starts `n - 1` more instances of each consumer service beside the
/// stack's own and waits until each group has shared its topic's
/// partitions among all of them (each holding some, none twice).
pub async fn scale_out(stack: &mut Stack, n: usize) -> anyhow::Result<Vec<Instance>> {
    let mut out = Vec::new();
    for (s, topic) in CONSUMERS {
        let mut urls = vec![stack.admin_url(s)];
        for _ in 1..n {
            urls.push(stack.start_extra(s).await?.1);
        }
        let shares = stack.wait_shared(&urls, topic, Duration::from_secs(120)).await?;
        eprintln!("bench: {} × {n}: partitions {shares:?}", s.name());
        out.extend(urls.into_iter().zip(shares).map(|(url, share)| Instance {
            service: s.name().to_owned(),
            url,
            partitions: share.len(),
            applied: 0.0,
            duplicates: 0.0,
        }));
    }
    Ok(out)
}

/// Reads each instance's handled counts (from its own metrics).
pub async fn count(instances: &mut [Instance]) {
    for i in instances {
        let read = |name| Stack::metric(&i.url, name, &[]);
        i.applied = read("consumer_events_applied_total").await.unwrap_or(0.0);
        i.duplicates = read("consumer_duplicates_absorbed_total").await.unwrap_or(0.0);
    }
}
