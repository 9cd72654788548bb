//! A small TCP fault proxy placed between a service and a dependency.
//!
//! Modes, switchable at run time: pass traffic through, add latency to every
//! chunk, reset (drop every connection, refuse new ones by closing at once),
//! blackhole (accept and swallow, never answer), or swallow responses
//! (requests reach the server, its answers never reach the client: a lost
//! acknowledgement). Existing connections
//! follow mode changes, so a keep-alive connection is not a way around it.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// What the proxy does to traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Forward unchanged.
    Pass,
    /// Forward each chunk after this delay.
    Latency(Duration),
    /// Close every connection.
    Reset,
    /// Accept and read, never forward or answer.
    Blackhole,
    /// Forward requests; read and drop whatever the server sends back.
    SwallowResponses,
}

/// A running proxy.
pub struct FaultProxy {
    /// `127.0.0.1:port` clients connect to.
    pub addr: String,
    mode: Arc<watch::Sender<Mode>>,
    acted: Arc<std::sync::atomic::AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl FaultProxy {
    /// Listens on a free loopback port and forwards to `target`.
    pub async fn start(target: String) -> anyhow::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?.to_string();
        let (tx, rx) = watch::channel(Mode::Pass);
        let acted = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let counter = acted.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                tokio::spawn(serve(client, target.clone(), rx.clone(), counter.clone()));
            }
        });
        Ok(Self {
            addr,
            mode: Arc::new(tx),
            acted,
            task,
        })
    }

    /// Switches the mode for new and existing connections.
    pub fn set(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }

    /// How many times a fault mode acted so far: a connection reset or
    /// swallowed, a chunk delayed. The evidence that a network fault fired.
    pub fn acted(&self) -> u64 {
        self.acted.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

type Acted = Arc<std::sync::atomic::AtomicU64>;

fn note(acted: &Acted) {
    acted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
}

/// Closes `stream` with a TCP RST (SO_LINGER 0), not a FIN: the peer sees
/// "connection reset by peer", as when a middlebox or a crashed host drops it.
#[allow(deprecated)] // deprecated for blocking on drop; a zero linger never blocks: the kernel sends the RST at once
fn reset(stream: TcpStream) {
    let _ = stream.set_linger(Some(std::time::Duration::ZERO));
    drop(stream);
}

async fn serve(mut client: TcpStream, target: String, mut mode: watch::Receiver<Mode>, acted: Acted) {
    let current = *mode.borrow();
    match current {
        Mode::Reset => {
            note(&acted);
            return reset(client);
        }
        Mode::Blackhole => {
            note(&acted);
            return swallow(client, mode).await;
        }
        _ => {}
    }
    let Ok(upstream) = TcpStream::connect(&target).await else {
        return;
    };
    {
        let (mut cr, mut cw) = client.split();
        let (mut ur, mut uw) = tokio::io::split(upstream);
        let mut m1 = mode.clone();
        let up = pump(&mut cr, &mut uw, &mut m1, &acted, Direction::Request);
        let down = pump(&mut ur, &mut cw, &mut mode, &acted, Direction::Response);
        tokio::select! {
            _ = up => {}
            _ = down => {}
        }
    }
    // A connection cut by a switch to reset mode is reset, not closed.
    if *mode.borrow() == Mode::Reset {
        note(&acted);
        reset(client);
    }
}

/// Which way a pump copies.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Direction {
    /// Client to server.
    Request,
    /// Server to client.
    Response,
}

/// Copies `from` to `to` following the mode; returns when either side
/// closes or the mode turns to reset/blackhole.
async fn pump<R, W>(from: &mut R, to: &mut W, mode: &mut watch::Receiver<Mode>, acted: &Acted, dir: Direction)
where
    R: tokio::io::AsyncRead + Unpin,
    W: tokio::io::AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = tokio::select! {
            r = from.read(&mut buf) => match r { Ok(0) | Err(_) => return, Ok(n) => n },
            changed = mode.changed() => {
                if changed.is_err() { return; }
                if matches!(*mode.borrow(), Mode::Reset | Mode::Blackhole) { return; }
                continue;
            }
        };
        let current = *mode.borrow();
        match current {
            Mode::Latency(d) => {
                note(acted);
                tokio::time::sleep(d).await;
            }
            Mode::Reset | Mode::Blackhole => return,
            Mode::SwallowResponses if dir == Direction::Response => {
                note(acted);
                continue;
            }
            Mode::SwallowResponses | Mode::Pass => {}
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

async fn swallow(mut client: TcpStream, mut mode: watch::Receiver<Mode>) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        tokio::select! {
            r = client.read(&mut buf) => if matches!(r, Ok(0) | Err(_)) { return },
            changed = mode.changed() => if changed.is_err() || *mode.borrow() != Mode::Blackhole { return },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn echo_server() -> String {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        addr
    }

    async fn roundtrip(addr: &str, timeout: Duration) -> Option<Vec<u8>> {
        let mut s = TcpStream::connect(addr).await.ok()?;
        s.write_all(b"ping").await.ok()?;
        let mut buf = [0u8; 4];
        tokio::time::timeout(timeout, s.read_exact(&mut buf)).await.ok()?.ok()?;
        Some(buf.to_vec())
    }

    #[tokio::test]
    async fn modes_pass_delay_reset_and_swallow() {
        let proxy = FaultProxy::start(echo_server().await).await.unwrap();
        assert_eq!(
            roundtrip(&proxy.addr, Duration::from_secs(1)).await.as_deref(),
            Some(&b"ping"[..])
        );
        proxy.set(Mode::Latency(Duration::from_millis(150)));
        let t = std::time::Instant::now();
        assert!(roundtrip(&proxy.addr, Duration::from_secs(2)).await.is_some());
        assert!(t.elapsed() >= Duration::from_millis(300), "delayed both ways");
        proxy.set(Mode::Reset);
        assert!(roundtrip(&proxy.addr, Duration::from_millis(500)).await.is_none());
        proxy.set(Mode::Blackhole);
        assert!(roundtrip(&proxy.addr, Duration::from_millis(300)).await.is_none());
        proxy.set(Mode::SwallowResponses);
        assert!(roundtrip(&proxy.addr, Duration::from_millis(300)).await.is_none());
        proxy.set(Mode::Pass);
        assert!(roundtrip(&proxy.addr, Duration::from_secs(1)).await.is_some());
        assert!(proxy.acted() >= 4, "each fault mode acted: {}", proxy.acted());
    }

    #[tokio::test]
    async fn reset_is_an_rst_not_a_fin() {
        let proxy = FaultProxy::start(echo_server().await).await.unwrap();
        proxy.set(Mode::Reset);
        let mut s = TcpStream::connect(&proxy.addr).await.unwrap();
        let _ = s.write_all(b"ping").await;
        let mut buf = [0u8; 4];
        let read = tokio::time::timeout(Duration::from_secs(2), s.read(&mut buf))
            .await
            .unwrap();
        assert_eq!(
            read.map_err(|e| e.kind()),
            Err(std::io::ErrorKind::ConnectionReset),
            "a FIN would read Ok(0)"
        );
        assert_eq!(proxy.acted(), 1);
    }
}
