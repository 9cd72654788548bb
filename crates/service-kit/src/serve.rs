//! The HTTP server every service runs: its axum router on hyper's HTTP/1
//! connections, with the limits a port open to clients needs. `axum::serve`
//! sets none of them (no timer, so not even hyper's default header timeout).
//!
//! - **Header read timeout**: a client has `HTTP_HEADER_TIMEOUT_SECS` to
//!   send a request's headers, and a kept-alive connection may idle that
//!   long between requests; past it, hyper closes the connection. A client
//!   that trickles its headers (slowloris) holds a connection no longer.
//! - **Body read timeout**: `HTTP_BODY_TIMEOUT_SECS` between two pieces of a
//!   request's body (as nginx's `client_body_timeout`); past it the read
//!   fails, the handler answers with an error and the connection ends.
//! - **Connection cap**: `HTTP_MAX_CONNECTIONS` served at once; beyond it,
//!   a new connection waits in the listen backlog until one closes.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt as _;

/// The limits of a service's HTTP port.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// Seconds a client has to send a request's headers, and the longest a
    /// kept-alive connection idles between requests; past it, the
    /// connection is closed.
    #[arg(long, env = "HTTP_HEADER_TIMEOUT_SECS", default_value_t = 30)]
    pub header_timeout_secs: u64,
    /// Seconds a request's body may pause between two pieces; past it, the
    /// read fails (the request is refused).
    #[arg(long, env = "HTTP_BODY_TIMEOUT_SECS", default_value_t = 30)]
    pub body_timeout_secs: u64,
    /// Connections served at once; more wait in the listen backlog until one closes.
    #[arg(long, env = "HTTP_MAX_CONNECTIONS", default_value_t = 4096)]
    pub max_connections: usize,
}

impl Default for ServeArgs {
    fn default() -> Self {
        Self {
            header_timeout_secs: 30,
            body_timeout_secs: 30,
            max_connections: 4096,
        }
    }
}

/// Serves `app` on `listener` within `limits` until `shutdown`; then stops
/// accepting and lets the open connections finish their requests. Handlers
/// see the peer's address as `ConnectInfo<SocketAddr>` (per-address limits).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ServeArgs,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let app = app.layer(tower_http::timeout::RequestBodyTimeoutLayer::new(Duration::from_secs(
        limits.body_timeout_secs,
    )));
    let mut http1 = hyper::server::conn::http1::Builder::new();
    http1
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_secs(limits.header_timeout_secs));
    let open = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let graceful = GracefulShutdown::new();
    loop {
        let permit = tokio::select! {
            _ = shutdown.cancelled() => break,
            permit = open.clone().acquire_owned() => permit.expect("the semaphore is never closed"),
        };
        let (stream, peer) = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors, say: wait, as axum::serve does.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let service = app
            .clone()
            .map_request(move |mut req: axum::http::Request<hyper::body::Incoming>| {
                req.extensions_mut().insert(ConnectInfo(peer));
                req.map(axum::body::Body::new)
            });
        let connection =
            graceful.watch(http1.serve_connection(TokioIo::new(stream), TowerToHyperService::new(service)));
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, %peer, "connection ended");
            }
            drop(permit);
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}
