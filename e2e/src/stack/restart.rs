//! Crashes on purpose: SIGKILL a process (a service or a Kafka node) and
//! start it again, with what shows it happened — the old process died of
//! the signal, a new one (another pid) serves.

use std::os::unix::process::ExitStatusExt as _;
use std::time::Duration;

use tokio::process::Child;

use super::{Service, Stack};

/// A process killed by [`Stack::kill`]: its pid and the signal that ended
/// it (as `wait` reported it).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Killed {
    pub pid: u32,
    pub signal: Option<i32>,
}

/// What a SIGKILL-and-restart did, as seen from outside the processes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Restarted {
    /// The process killed; None when none was running.
    pub killed: Option<Killed>,
    /// The pid of the process serving now.
    pub new_pid: Option<u32>,
}

impl Restarted {
    /// Whether the restart is evident: a running process died of SIGKILL
    /// and another process serves in its place.
    pub fn evident(&self) -> bool {
        matches!(
            (self.killed, self.new_pid),
            (Some(Killed { pid, signal: Some(9) }), Some(new)) if new != pid
        )
    }
}

/// What showed that it happened, for a report.
impl std::fmt::Display for Restarted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.killed, self.new_pid) {
            (Some(k), Some(new)) => match k.signal {
                Some(sig) => write!(f, "pid {} ended by signal {sig}, pid {new} serves", k.pid),
                None => write!(f, "pid {} ended without a signal, pid {new} serves", k.pid),
            },
            (Some(k), None) => write!(f, "pid {} killed, no process serves", k.pid),
            (None, _) => write!(f, "it was not running: nothing killed"),
        }
    }
}

/// SIGKILLs `child` and reaps it.
async fn kill_child(mut child: Child) -> anyhow::Result<Killed> {
    let pid = child.id().unwrap_or_default();
    child.start_kill()?;
    let status = child.wait().await?;
    Ok(Killed {
        pid,
        signal: status.signal(),
    })
}

impl Stack {
    /// SIGKILLs a process (a crash: no shutdown hooks run) and reaps it;
    /// None when it was not running.
    pub async fn kill(&mut self, s: Service) -> anyhow::Result<Option<Killed>> {
        let Some(child) = self.procs.remove(&s) else {
            return Ok(None);
        };
        let killed = kill_child(child).await?;
        *self.kills.entry(s).or_default() += 1;
        Ok(Some(killed))
    }

    /// SIGKILLs and starts a process again, waiting until it is ready.
    pub async fn restart(&mut self, s: Service) -> anyhow::Result<Restarted> {
        let killed = self.kill(s).await?;
        self.start_service(s).await?;
        let new_pid = self.procs.get(&s).and_then(Child::id);
        Ok(Restarted { killed, new_pid })
    }

    /// SIGKILLs a process and starts it again without waiting for it to be
    /// ready: an armed crash point may fire before the first health check.
    pub async fn restart_unready(&mut self, s: Service) -> anyhow::Result<()> {
        self.kill(s).await?;
        self.spawn(s)
    }

    /// SIGKILLs Kafka node `id` and starts it again (its data stays), then
    /// waits until every node answers. Node 1 is [`Service::Broker`].
    pub async fn restart_broker_node(&mut self, id: u32) -> anyhow::Result<Restarted> {
        if id == 1 {
            return self.restart(Service::Broker).await;
        }
        let killed = match self.node_procs.remove(&id) {
            Some(child) => {
                *self.kills.entry(Service::Broker).or_default() += 1;
                Some(kill_child(child).await?)
            }
            None => None,
        };
        self.spawn_node(id)?;
        let n = self.broker_nodes.len();
        testkit::broker::wait_ready(&self.kafka_admin_config(), n, Duration::from_secs(90)).await?;
        let new_pid = self.node_procs.get(&id).and_then(Child::id);
        Ok(Restarted { killed, new_pid })
    }
}

#[cfg(test)]
mod tests {
    use super::{Killed, Restarted};

    #[test]
    fn a_restart_is_evident_only_when_a_sigkilled_process_was_replaced() {
        let killed = |signal| Some(Killed { pid: 10, signal });
        let seen = |killed, new_pid| Restarted { killed, new_pid }.evident();
        assert!(seen(killed(Some(9)), Some(11)));
        assert!(!seen(None, Some(11)), "nothing was running");
        assert!(!seen(killed(None), Some(11)), "it had exited on its own");
        assert!(!seen(killed(Some(9)), None), "nothing serves");
        assert!(!seen(killed(Some(9)), Some(10)), "the same process");
    }
}
