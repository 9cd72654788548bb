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
//! - **TLS** (rustls), when `HTTP_TLS_CERT_FILE` and `HTTP_TLS_KEY_FILE`
//!   name a PEM certificate chain and its key: the handshake runs in the
//!   connection's own task, within the header timeout, so a client that
//!   stalls it holds only its own connection.
//! - **Lingering close**: once a connection is done, its write side is shut
//!   (TLS `close_notify`, then FIN) and what the client still sends is read
//!   and dropped for up to [`LINGER`] (and [`LINGER_BYTES`]) before the
//!   socket closes. An answer sent before its request's body was read — an
//!   early 401 or 413 — then reaches the client instead of a reset (closing
//!   a socket with unread data resets it, and the client loses the answer).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt as _;

/// How long a closing connection reads and drops what its client still sends.
pub const LINGER: Duration = Duration::from_secs(2);
/// How much of it, at most.
pub const LINGER_BYTES: usize = 1 << 20;

/// Shuts `io`'s write side and reads what the peer still sends, dropping
/// it, until the peer closes, [`LINGER`] passes or [`LINGER_BYTES`] came.
async fn linger<S: AsyncRead + AsyncWrite + Unpin>(mut io: S) {
    let _ = tokio::time::timeout(LINGER, async {
        let _ = io.shutdown().await;
        let (mut buf, mut left) = ([0u8; 8192], LINGER_BYTES);
        while left > 0 {
            match io.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    })
    .await;
}

/// Serves HTTP/1 on `io` until the connection is done (or, once `shutdown`
/// is cancelled, after its request in flight), then lingers.
async fn connection<S, B>(
    http1: &hyper::server::conn::http1::Builder,
    io: S,
    service: B,
    shutdown: &CancellationToken,
) -> hyper::Result<()>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    B: hyper::service::HttpService<hyper::body::Incoming> + Unpin,
    B::Future: Unpin,
    B::ResBody: 'static,
    <B::ResBody as hyper::body::Body>::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut conn = http1.serve_connection(TokioIo::new(io), service);
    let ended = tokio::select! {
        ended = std::future::poll_fn(|cx| conn.poll_without_shutdown(cx)) => ended,
        () = shutdown.cancelled() => {
            std::pin::Pin::new(&mut conn).graceful_shutdown();
            std::future::poll_fn(|cx| conn.poll_without_shutdown(cx)).await
        }
    };
    linger(conn.into_parts().io.into_inner()).await;
    ended
}

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
    /// Serve TLS with this PEM certificate chain (the server's certificate
    /// first); needs `HTTP_TLS_KEY_FILE`. Unset: plain HTTP.
    #[arg(long, env = "HTTP_TLS_CERT_FILE", requires = "tls_key_file")]
    pub tls_cert_file: Option<PathBuf>,
    /// The PEM private key of `HTTP_TLS_CERT_FILE`'s certificate.
    #[arg(long, env = "HTTP_TLS_KEY_FILE", requires = "tls_cert_file")]
    pub tls_key_file: Option<PathBuf>,
}

/// Why the port's TLS settings cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A PEM file could not be read or holds no certificate / key.
    #[error("{var} ({path}): {error}")]
    File {
        /// The variable that named it.
        var: &'static str,
        /// The file.
        path: String,
        /// What was wrong.
        error: String,
    },
    /// The certificate and key do not make a server configuration.
    #[error("HTTP_TLS_CERT_FILE / HTTP_TLS_KEY_FILE: {0}")]
    Config(#[from] rustls::Error),
}

impl ServeArgs {
    /// The TLS acceptor of these settings, or `None` for plain HTTP.
    pub fn tls(&self) -> Result<Option<tokio_rustls::TlsAcceptor>, TlsError> {
        use rustls::pki_types::pem::PemObject as _;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let (Some(cert), Some(key)) = (&self.tls_cert_file, &self.tls_key_file) else {
            return Ok(None);
        };
        let file_error = |var: &'static str, path: &PathBuf, error: String| TlsError::File {
            var,
            path: path.display().to_string(),
            error,
        };
        let chain = CertificateDer::pem_file_iter(cert)
            .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
            .map_err(|e| file_error("HTTP_TLS_CERT_FILE", cert, e.to_string()))?;
        if chain.is_empty() {
            return Err(file_error(
                "HTTP_TLS_CERT_FILE",
                cert,
                "no certificate in the file".into(),
            ));
        }
        let key = PrivateKeyDer::from_pem_file(key).map_err(|e| file_error("HTTP_TLS_KEY_FILE", key, e.to_string()))?;
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(chain, key)?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Some(tokio_rustls::TlsAcceptor::from(Arc::new(config))))
    }
}

impl Default for ServeArgs {
    fn default() -> Self {
        Self {
            header_timeout_secs: 30,
            body_timeout_secs: 30,
            max_connections: 4096,
            tls_cert_file: None,
            tls_key_file: None,
        }
    }
}

/// Serves `app` on `listener` within `limits` until `shutdown`; then stops
/// accepting and lets the open connections finish their requests. Handlers
/// see the peer's address as `ConnectInfo<SocketAddr>` (per-address limits).
/// Fails at once if `limits` names TLS files it cannot use.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ServeArgs,
    shutdown: CancellationToken,
) -> Result<(), TlsError> {
    let tls = limits.tls()?;
    let handshake_timeout = Duration::from_secs(limits.header_timeout_secs);
    let app = app.layer(tower_http::timeout::RequestBodyTimeoutLayer::new(Duration::from_secs(
        limits.body_timeout_secs,
    )));
    let mut http1 = hyper::server::conn::http1::Builder::new();
    http1
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_secs(limits.header_timeout_secs));
    let cap = limits.max_connections.max(1);
    let open = Arc::new(Semaphore::new(cap));
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
        let (http1, shutdown, tls) = (http1.clone(), shutdown.clone(), tls.clone());
        tokio::spawn(async move {
            // Each request's future boxed: the connection is polled in place
            // and handed back whole for its lingering close.
            let service = hyper::service::service_fn(move |req| {
                let service = service.clone();
                Box::pin(async move { service.oneshot(req).await })
            });
            let ended = match tls {
                None => connection(&http1, stream, service, &shutdown).await,
                Some(tls) => match tokio::time::timeout(handshake_timeout, tls.accept(stream)).await {
                    Ok(Ok(stream)) => connection(&http1, stream, service, &shutdown).await,
                    Ok(Err(e)) => {
                        tracing::debug!(error = %e, %peer, "TLS handshake failed");
                        Ok(())
                    }
                    Err(_) => {
                        tracing::debug!(%peer, "TLS handshake timed out");
                        Ok(())
                    }
                },
            };
            if let Err(e) = ended {
                tracing::debug!(error = %e, %peer, "connection ended");
            }
            drop(permit);
        });
    }
    drop(listener);
    // Every connection's task holds a permit until it is done: all back,
    // every request in flight has been answered.
    let _ = open.acquire_many(cap as u32).await;
    Ok(())
}
