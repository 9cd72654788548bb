//! Each process of a stack under a uid of its own (`StackOptions::isolated_uids`),
//! so that a network partition can cut one of them off by its uid.

use super::{Service, Stack};

impl Stack {
    /// The uid processes of `s` run as (its extra instances too; for
    /// [`Service::Broker`], node 1), when the stack isolates them.
    pub fn process_uid(&self, s: Service) -> Option<u32> {
        self.opts.isolated_uids.then(|| match s {
            Service::Broker => Self::uid_of_node(1),
            other => testkit::partition::uid(Service::ALL.iter().position(|x| *x == other).unwrap_or(0) as u32),
        })
    }

    /// The uid Kafka node `id` runs as, when the stack isolates processes.
    pub fn node_uid(&self, id: u32) -> Option<u32> {
        self.opts.isolated_uids.then(|| Self::uid_of_node(id))
    }

    pub(super) fn uid_of_node(id: u32) -> u32 {
        testkit::partition::uid(10 + id)
    }
}

/// Gives `path` and everything under it to `uid` (a Kafka node's data).
pub(super) fn chown_tree(path: &std::path::Path, uid: u32) -> anyhow::Result<()> {
    std::os::unix::fs::chown(path, Some(uid), None)?;
    if path.is_dir() {
        for entry in std::fs::read_dir(path)? {
            chown_tree(&entry?.path(), uid)?;
        }
    }
    Ok(())
}
