//! End-to-end tests over real processes: tansu, PostgreSQL, the five services.

mod api;
mod compose;
mod crash;
mod payments;
mod saga;

/// Boots a fresh stack for one test.
pub async fn stack(label: &str) -> e2e::Stack {
    let opts = e2e::StackOptions::ephemeral(label).expect("stack options");
    e2e::Stack::start(opts).await.expect("stack starts")
}
