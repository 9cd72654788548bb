//! Network partitions on loopback, with nftables: a process's packets to
//! some ports dropped, matched by the uid it runs as (`meta skuid`). A
//! harness that starts each process under a uid of its own can cut one
//! service from every broker while its database stays reachable, or one
//! Kafka node from the other two while clients still reach it. Each cut is
//! a table of its own, its rules count what they dropped (the evidence a
//! cut happened), and it is deleted when dropped. Nothing outside
//! 127.0.0.0/8 is touched: the rules match loopback ports only.

use std::process::Command;

/// The uid a harness gives its `k`-th process (services, Kafka nodes):
/// outside the range of real users, one per process kind.
pub fn uid(k: u32) -> u32 {
    61_000 + k
}

/// Makes sure `nft` runs, installing Debian's `nftables` when missing (as root).
pub fn ensure() -> anyhow::Result<()> {
    if Command::new("nft")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        return Ok(());
    }
    eprintln!("nft is missing: installing Debian's nftables (once)");
    crate::postgres::apt_install(&["nftables"])
}

/// One partition: packets of the listed uids to the listed loopback ports
/// are dropped while it lives.
#[derive(Debug)]
pub struct Cut {
    table: String,
}

impl Cut {
    /// Cuts, for each `(uid, ports)`, the processes running as `uid` from
    /// those TCP ports on 127.0.0.0/8: new connections hang, open ones stall
    /// (their packets go nowhere), as over a broken network.
    pub fn new(name: &str, rules: &[(u32, Vec<u16>)]) -> anyhow::Result<Self> {
        let table = format!("eo_{}_{}", name.replace('-', "_"), std::process::id());
        let mut script =
            format!("table inet {table} {{\n  chain out {{\n    type filter hook output priority 0; policy accept;\n");
        for (uid, ports) in rules {
            let ports: Vec<String> = ports.iter().map(u16::to_string).collect();
            script.push_str(&format!(
                "    ip daddr 127.0.0.0/8 meta skuid {uid} tcp dport {{ {} }} counter drop\n",
                ports.join(", ")
            ));
        }
        script.push_str("  }\n}\n");
        run_nft(&["-f", "-"], Some(&script))?;
        Ok(Self { table })
    }

    /// Packets dropped so far, summed over the rules (nftables' own counters).
    pub fn dropped(&self) -> anyhow::Result<u64> {
        let out = run_nft(&["list", "table", "inet", &self.table], None)?;
        Ok(packets(&out))
    }
}

impl Drop for Cut {
    fn drop(&mut self) {
        let _ = run_nft(&["delete", "table", "inet", &self.table], None);
    }
}

/// Sums the `counter packets N` of an `nft list` output.
fn packets(listing: &str) -> u64 {
    listing
        .split("counter packets ")
        .skip(1)
        .filter_map(|rest| rest.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

fn run_nft(args: &[&str], stdin: Option<&str>) -> anyhow::Result<String> {
    use std::io::Write as _;
    let mut child = Command::new("nft")
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    if let Some(text) = stdin {
        child.stdin.take().expect("piped").write_all(text.as_bytes())?;
    }
    drop(child.stdin.take());
    let out = child.wait_with_output()?;
    anyhow::ensure!(
        out.status.success(),
        "nft {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    #[test]
    fn counters_are_summed_over_the_rules() {
        let listing =
            "table inet t {\n chain out {\n  meta skuid 61001 tcp dport { 9092 } counter packets 12 bytes 720 drop\n  \
                       meta skuid 61002 tcp dport { 9093 } counter packets 3 bytes 180 drop\n }\n}\n";
        assert_eq!(super::packets(listing), 15);
        assert_eq!(super::packets("table inet t {}"), 0);
    }
}
