//! Free loopback ports for the processes a test starts.
//!
//! Asking the kernel for a free port (bind to port 0, read it, close)
//! twice in a row can return the same port: a broker once got the same
//! one for its client and its controller listeners and refused to start.
//! [`free`] never hands out a port twice in one process.

use std::collections::HashSet;
use std::sync::Mutex;

static HANDED_OUT: Mutex<Option<HashSet<u16>>> = Mutex::new(None);

/// A loopback port free now and not handed out before by this process.
pub fn free() -> std::io::Result<u16> {
    let mut handed = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
    let handed = handed.get_or_insert_with(HashSet::new);
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        if handed.insert(port) {
            return Ok(port);
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn no_port_is_handed_out_twice() {
        let ports: Vec<u16> = (0..500).map(|_| super::free().unwrap()).collect();
        let distinct: std::collections::HashSet<_> = ports.iter().collect();
        assert_eq!(distinct.len(), ports.len());
    }
}
