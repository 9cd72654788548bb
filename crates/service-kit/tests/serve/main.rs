//! The HTTP port's limits against real sockets: a client that trickles its
//! headers or idles is cut off, a body that stops coming is refused, and
//! beyond the connection cap a new connection waits until one closes; with
//! TLS, only a client that trusts the server's CA is served, and a stalled
//! handshake holds nothing but its own connection.

use std::time::{Duration, Instant};

use axum::routing::{get, post};
use axum::Router;
use service_kit::ServeArgs;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// A server on a free port with `limits`; its address and its stop token.
async fn start(limits: ServeArgs) -> (std::net::SocketAddr, CancellationToken) {
    let app = Router::new()
        .route("/ok", get(|| async { "ok" }))
        .route("/echo", post(|body: axum::body::Bytes| async move { body }))
        // Answers at once, reading nothing of the body (as an early 401 or 413).
        .route(
            "/early",
            post(|| async { (axum::http::StatusCode::UNAUTHORIZED, "no credential") }),
        );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = CancellationToken::new();
    tokio::spawn(service_kit::serve::serve(listener, app, limits, stop.clone()));
    (addr, stop)
}

fn limits(header: u64, body: u64, connections: usize) -> ServeArgs {
    ServeArgs {
        header_timeout_secs: header,
        body_timeout_secs: body,
        max_connections: connections,
        ..ServeArgs::default()
    }
}

/// Reads until the server closes the connection (or `within` passes): what
/// it sent, and when it closed.
async fn until_closed(stream: &mut TcpStream, within: Duration) -> (String, Option<Duration>) {
    let started = Instant::now();
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        match tokio::time::timeout(within.saturating_sub(started.elapsed()), stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return (String::from_utf8_lossy(&got).into_owned(), Some(started.elapsed())),
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
            Err(_) => return (String::from_utf8_lossy(&got).into_owned(), None),
        }
    }
}

/// Removal tried: the header read timeout off (`header_read_timeout(None)`):
/// the trickling client is never cut off and this fails.
#[tokio::test]
async fn a_client_that_trickles_its_headers_or_idles_is_cut_off() {
    let (addr, stop) = start(limits(1, 30, 64)).await;
    let mut slow = TcpStream::connect(addr).await.unwrap();
    slow.write_all(b"GET /ok HTTP/1.1\r\nhost: x\r\n").await.unwrap();
    let (_, closed) = until_closed(&mut slow, Duration::from_secs(4)).await;
    let closed = closed.expect("the trickling client was not cut off within 4 s");
    assert!(
        closed >= Duration::from_millis(900),
        "cut off after {closed:?}, before its second"
    );

    // A whole request is answered; the connection, kept alive, idles; then it is closed.
    let mut idle = TcpStream::connect(addr).await.unwrap();
    idle.write_all(b"GET /ok HTTP/1.1\r\nhost: x\r\n\r\n").await.unwrap();
    let (answer, closed) = until_closed(&mut idle, Duration::from_secs(4)).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(
        closed.is_some(),
        "an idle kept-alive connection was not closed within 4 s"
    );
    stop.cancel();
}

/// Removal tried: the body timeout layer taken out: the request waits for
/// its body for ever and this fails.
#[tokio::test]
async fn a_body_that_stops_coming_is_refused() {
    let (addr, stop) = start(limits(30, 1, 64)).await;
    let mut slow = TcpStream::connect(addr).await.unwrap();
    slow.write_all(b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 10\r\n\r\nabc")
        .await
        .unwrap();
    let started = Instant::now();
    let mut buf = [0u8; 512];
    let n = tokio::time::timeout(Duration::from_secs(4), slow.read(&mut buf))
        .await
        .expect("no answer within 4 s to a body that stopped")
        .unwrap();
    let answer = String::from_utf8_lossy(&buf[..n]);
    assert!(answer.starts_with("HTTP/1.1 4"), "{answer}");
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "{:?}",
        started.elapsed()
    );
    stop.cancel();
}

/// With one connection allowed, a second client waits until the first's
/// connection closes (its header timeout), then is served. Removal tried:
/// no cap: the second is answered at once and this fails.
#[tokio::test]
async fn beyond_the_connection_cap_a_new_connection_waits_for_one_to_close() {
    let (addr, stop) = start(limits(1, 30, 1)).await;
    let first = TcpStream::connect(addr).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut second = TcpStream::connect(addr).await.unwrap();
    let started = Instant::now();
    second
        .write_all(b"GET /ok HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let (answer, _) = until_closed(&mut second, Duration::from_secs(4)).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(700),
        "answered after {waited:?}: the first connection still held the only place"
    );
    drop(first);
    stop.cancel();
}

/// The port with TLS: a client trusting the CA gets its answer; plain HTTP,
/// a client trusting only the system's roots, and a handshake that never
/// starts get nothing — and the stalled handshake is cut off within the
/// header timeout without holding up anyone else. Removal tried: the TLS
/// acceptor bypassed (every connection served plain) — the trusting
/// client's request fails.
#[tokio::test]
async fn with_tls_only_a_client_trusting_the_ca_is_served() {
    let dir = std::env::temp_dir().join(format!("eo-serve-tls-{}", uuid::Uuid::new_v4().simple()));
    let ca = testkit::tls::Authority::generate("serve test CA").unwrap();
    let files = ca.write_loopback(&dir, "server").unwrap();
    let tls = ServeArgs {
        tls_cert_file: Some(files.cert.clone()),
        tls_key_file: Some(files.key.clone()),
        ..limits(1, 30, 64)
    };
    let (addr, stop) = start(tls).await;
    // A client that opens a connection and never says hello.
    let mut stalled = TcpStream::connect(addr).await.unwrap();
    let roots = reqwest::Certificate::from_pem(ca.cert_pem.as_bytes()).unwrap();
    let trusting = reqwest::Client::builder().tls_certs_only([roots]).build().unwrap();
    for host in ["localhost", "127.0.0.1"] {
        let url = format!("https://{host}:{}/ok", addr.port());
        let resp = trusting.get(&url).send().await.unwrap();
        assert_eq!(resp.text().await.unwrap(), "ok", "{url}");
    }
    let plain = reqwest::get(format!("http://{addr}/ok")).await;
    assert!(plain.is_err(), "plain HTTP on the TLS port: {plain:?}");
    let untrusting = reqwest::Client::new()
        .get(format!("https://127.0.0.1:{}/ok", addr.port()))
        .send()
        .await;
    assert!(
        untrusting.is_err(),
        "a client that does not trust the CA: {untrusting:?}"
    );
    let (_, closed) = until_closed(&mut stalled, Duration::from_secs(4)).await;
    assert!(closed.is_some(), "the stalled handshake was never cut off");
    stop.cancel();
    std::fs::remove_dir_all(&dir).unwrap();
}

/// TLS files that cannot be used stop the server at once, naming the variable.
#[tokio::test]
async fn unusable_tls_files_stop_the_server_naming_the_variable() {
    let missing = ServeArgs {
        tls_cert_file: Some("/nonexistent/cert.pem".into()),
        tls_key_file: Some("/nonexistent/key.pem".into()),
        ..ServeArgs::default()
    };
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let err = service_kit::serve::serve(listener, Router::new(), missing, CancellationToken::new())
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .starts_with("HTTP_TLS_CERT_FILE (/nonexistent/cert.pem)"),
        "{err}"
    );
}

/// A response sent before the request's body was read — an early 401 or
/// 413 — reaches a TLS client as its status, not as a reset: the server
/// lingers, reading and dropping what the client still sends, before it
/// closes (schemathesis's "EOF in violation of protocol"). Removal tried:
/// no lingering — the client saw its connection reset, and this failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_early_answer_reaches_a_tls_client_that_is_still_sending() {
    let dir = std::env::temp_dir().join(format!("eo-serve-linger-{}", uuid::Uuid::new_v4().simple()));
    let ca = testkit::tls::Authority::generate("serve test CA").unwrap();
    let files = ca.write_loopback(&dir, "server").unwrap();
    let tls = ServeArgs {
        tls_cert_file: Some(files.cert.clone()),
        tls_key_file: Some(files.key.clone()),
        ..limits(5, 30, 64)
    };
    let (addr, stop) = start(tls).await;
    let roots = reqwest::Certificate::from_pem(ca.cert_pem.as_bytes()).unwrap();
    // A fresh connection each round: the server closes one whose body it
    // did not read, and a pooled one would race that close.
    let client = reqwest::Client::builder()
        .tls_certs_only([roots])
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let body = vec![b'x'; 512 * 1024];
    for round in 0..10 {
        let sent = client
            .post(format!("https://localhost:{}/early", addr.port()))
            .body(body.clone())
            .send()
            .await;
        let status = sent.map(|r| r.status().as_u16());
        assert_eq!(status.as_ref().ok(), Some(&401), "round {round}: {status:?}");
    }
    stop.cancel();
    std::fs::remove_dir_all(&dir).unwrap();
}
