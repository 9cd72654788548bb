//! Network partitions on loopback: nftables rules that drop the packets of
//! one process's uid to some ports ([`testkit::partition::Cut`]), counted by
//! the rules themselves — the evidence a cut happened.

use std::time::Duration;

use anyhow::Context as _;
use testkit::partition::Cut;

use crate::stack::{Service, Stack};

/// How long a service stays cut from the brokers: longer than a
/// consumer's session (10 s), so its group gives its partitions away.
const SERVICE_CUT: Duration = Duration::from_secs(12);

/// How long a Kafka node stays cut from the other two: longer than a
/// broker's session with the controller (9 s), so it is fenced and its
/// partitions get other leaders.
const NODE_CUT: Duration = Duration::from_secs(15);

/// Cuts a consumer service from every Kafka node for [`SERVICE_CUT`]; its
/// database and HTTP stay reachable. Returns what happened and whether
/// packets were dropped.
pub(super) async fn cut_service(stack: &mut Stack, s: Service) -> anyhow::Result<(String, bool)> {
    let uid = stack
        .process_uid(s)
        .context("the stack does not run its processes under uids of their own")?;
    let ports: Vec<u16> = stack
        .broker_nodes()
        .iter()
        .flat_map(|n| [n.port, n.advertised_port])
        .collect();
    let revoked_before = super::revocations(stack, s).await;
    let cut = Cut::new("service", &[(uid, ports)])?;
    tokio::time::sleep(SERVICE_CUT).await;
    let dropped = cut.dropped()?;
    let revoked = super::revocations(stack, s).await - revoked_before;
    drop(cut);
    Ok((
        format!(
            "{} cut from every Kafka node for {} s (its database reachable): {dropped} packets dropped, \
             partitions revoked meanwhile {revoked}",
            s.name(),
            SERVICE_CUT.as_secs()
        ),
        dropped > 0,
    ))
}

/// Cuts one Kafka node from the other two, both ways (client, controller
/// and replication ports), for [`NODE_CUT`]; clients still reach it.
pub(super) async fn isolate_node(stack: &mut Stack, node: u32) -> anyhow::Result<(String, bool)> {
    let nodes = stack.broker_nodes().to_vec();
    anyhow::ensure!(nodes.len() >= 3, "a node can be isolated only in a cluster of three");
    let isolated = &nodes[node as usize - 1];
    let ports = |n: &testkit::broker::NodeSpec| vec![n.port, n.controller_port, n.advertised_port];
    let uid = |id| {
        stack
            .node_uid(id)
            .context("the stack does not run its nodes under uids of their own")
    };
    let others: Vec<_> = nodes.iter().filter(|n| n.id != isolated.id).collect();
    let mut rules = vec![(uid(isolated.id)?, others.iter().flat_map(|n| ports(n)).collect())];
    for n in &others {
        rules.push((uid(n.id)?, ports(isolated)));
    }
    let cut = Cut::new("node", &rules)?;
    tokio::time::sleep(NODE_CUT).await;
    let dropped = cut.dropped()?;
    drop(cut);
    Ok((
        format!(
            "kafka node {} of {} cut from the other two for {} s (clients still reach it): {dropped} packets dropped",
            isolated.id,
            nodes.len(),
            NODE_CUT.as_secs()
        ),
        dropped > 0,
    ))
}
