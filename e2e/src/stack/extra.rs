//! Extra instances of a service beside the first: same database and
//! consumer group, own admin port — the second member of a consumer group.

use super::{free_port, terminate, Service, Stack};

impl Stack {
    /// Starts a second instance of a service (on its own ports, same
    /// database and consumer group) next to the first; returns its pid and
    /// the base URL of its admin endpoints.
    pub async fn start_extra(&mut self, s: Service) -> anyhow::Result<(u32, String)> {
        anyhow::ensure!(s != Service::Broker, "one broker only");
        let mut env = self.env(s);
        env.retain(|(k, _)| {
            !["HTTP_ADDR", "ADMIN_ADDR", "FAILPOINTS", "KAFKA_GROUP_INSTANCE_ID"].contains(&k.as_str())
        });
        if s.has_api() {
            env.push(("HTTP_ADDR".into(), format!("127.0.0.1:{}", free_port()?)));
        }
        let admin = format!("127.0.0.1:{}", free_port()?);
        env.push(("ADMIN_ADDR".into(), admin.clone()));
        let child = self.launch(s, env, &format!("{}-extra", s.name()))?;
        let pid = child.id().unwrap_or_default();
        self.extras.push((s, child));
        Ok((pid, format!("http://{admin}")))
    }

    /// SIGKILLs the extra instance with process id `pid`; false if there is none.
    pub async fn kill_extra(&mut self, pid: u32) -> bool {
        let Some(i) = self.extras.iter().position(|(_, c)| c.id() == Some(pid)) else {
            return false;
        };
        let (s, mut child) = self.extras.remove(i);
        let _ = child.kill().await;
        *self.kills.entry(s).or_default() += 1;
        true
    }

    /// Stops the extra instance with process id `pid` with SIGTERM (a clean
    /// leave of its consumer group); false if there is none.
    pub async fn stop_extra(&mut self, pid: u32) -> bool {
        let Some(i) = self.extras.iter().position(|(_, c)| c.id() == Some(pid)) else {
            return false;
        };
        let (_, mut child) = self.extras.remove(i);
        terminate(&mut child).await;
        true
    }

    /// SIGKILLs every extra instance.
    pub async fn kill_extras(&mut self) {
        for (_, mut child) in self.extras.drain(..) {
            let _ = child.kill().await;
        }
    }
}

impl Stack {
    /// Stops every service with SIGINT, as ctrl-c in a terminal does, in
    /// reverse start order, and returns how each one ended: its exit status,
    /// or `None` when it was still running 30 s later (then SIGKILLed). The
    /// broker keeps running until [`Stack::shutdown`].
    pub async fn interrupt_services(&mut self) -> Vec<(Service, Option<std::process::ExitStatus>)> {
        let mut out = Vec::new();
        for s in Service::ALL.into_iter().rev().filter(|s| *s != Service::Broker) {
            let Some(mut child) = self.procs.remove(&s) else {
                continue;
            };
            let Some(pid) = child.id() else { continue };
            let _ = crate::signal(pid, nix::sys::signal::Signal::SIGINT);
            let status = match tokio::time::timeout(std::time::Duration::from_secs(30), child.wait()).await {
                Ok(Ok(status)) => Some(status),
                _ => {
                    let _ = child.kill().await;
                    None
                }
            };
            out.push((s, status));
        }
        out
    }
}
