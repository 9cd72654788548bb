//! Which process listens on a TCP port, read from `/proc` (Linux).
//!
//! A harness that starts a service on a port it picked checks that the
//! process answering there is the one it started, not another test's
//! service that took the port first. The services need no cooperation for
//! that (no identity header): the kernel knows who owns the socket.

use std::collections::HashSet;

/// Whether process `pid` owns a socket listening on `port` (IPv4 or IPv6).
/// False when `/proc` cannot tell (another OS, or the process is gone).
pub fn listens_on(pid: u32, port: u16) -> bool {
    let inodes = listening_inodes(port);
    if inodes.is_empty() {
        return false;
    }
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.flatten().any(|fd| {
        std::fs::read_link(fd.path()).ok().is_some_and(|target| {
            target
                .to_str()
                .and_then(|t| t.strip_prefix("socket:["))
                .and_then(|t| t.strip_suffix(']'))
                .and_then(|i| i.parse::<u64>().ok())
                .is_some_and(|i| inodes.contains(&i))
        })
    })
}

/// Socket inodes in state LISTEN on `port`.
fn listening_inodes(port: u16) -> HashSet<u64> {
    const LISTEN: &str = "0A";
    let mut out = HashSet::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let cols: Vec<&str> = line.split_whitespace().collect();
            let (Some(local), Some(state), Some(inode)) = (cols.get(1), cols.get(3), cols.get(9)) else {
                continue;
            };
            let local_port = local
                .rsplit_once(':')
                .and_then(|(_, p)| u16::from_str_radix(p, 16).ok());
            if *state == LISTEN && local_port == Some(port) {
                if let Ok(i) = inode.parse() {
                    out.insert(i);
                }
            }
        }
    }
    out
}

/// CPU seconds (user + system) used so far by every process on the machine,
/// summed per command name (`/proc/<pid>/stat`'s `comm`, at most 15
/// characters: `inventory-servi`). Processes that ended are not counted, so
/// take differences over a window in which the processes of interest live.
pub fn cpu_seconds_by_command() -> std::collections::BTreeMap<String, f64> {
    let mut out = std::collections::BTreeMap::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return out;
    };
    for entry in procs.flatten() {
        if let Some((comm, secs)) = cpu_of(&entry.path()) {
            *out.entry(comm).or_insert(0.0) += secs;
        }
    }
    out
}

/// CPU seconds (user + system) used so far by process `pid` (0 when gone).
pub fn cpu_seconds_of(pid: u32) -> f64 {
    cpu_of(std::path::Path::new(&format!("/proc/{pid}"))).map_or(0.0, |(_, secs)| secs)
}

/// The command name and CPU seconds of the process at `/proc/<pid>`.
fn cpu_of(proc_dir: &std::path::Path) -> Option<(String, f64)> {
    let stat = std::fs::read_to_string(proc_dir.join("stat")).ok()?;
    // pid (comm) state ppid … utime stime: fields 14 and 15.
    let (open, close) = (stat.find('(')?, stat.rfind(')')?);
    let fields: Vec<&str> = stat.get(close + 2..)?.split(' ').collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok()).unwrap_or(0.0);
    Some((stat[open + 1..close].to_owned(), (ticks(11) + ticks(12)) / 100.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_this_process_on_its_own_listener_only() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        assert!(listens_on(std::process::id(), port));
        drop(listener);
        assert!(!listens_on(std::process::id(), port));
        // pid 1 does not own our port.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        assert!(!listens_on(1, listener.local_addr().unwrap().port()));
    }
}
