//! A cut drops the packets of one uid to the listed loopback ports, and
//! only those: another uid, or another port, still connects.

use std::os::unix::process::CommandExt as _;
use std::process::Command;

use testkit::partition::{self, Cut};

/// Whether a process running as `uid` connects to 127.0.0.1:`port` within 2 s.
fn connects(uid: u32, port: u16) -> bool {
    let code = format!("import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2)");
    Command::new("python3")
        .args(["-c", &code])
        .uid(uid)
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap()
        .success()
}

#[test]
fn a_cut_drops_one_uids_packets_to_its_ports_and_counts_them() {
    partition::ensure().unwrap();
    let cut_off = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let other = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let (port, other_port) = (cut_off.local_addr().unwrap().port(), other.local_addr().unwrap().port());
    let (isolated, bystander) = (partition::uid(90), partition::uid(91));
    assert!(connects(isolated, port), "before the cut");
    let cut = Cut::new("partition-test", &[(isolated, vec![port])]).unwrap();
    assert!(!connects(isolated, port), "the cut uid's SYN is dropped");
    assert!(cut.dropped().unwrap() > 0, "and counted");
    assert!(connects(bystander, port), "another uid still connects");
    assert!(connects(isolated, other_port), "another port is still reachable");
    drop(cut);
    assert!(connects(isolated, port), "healed when the cut is dropped");
}
