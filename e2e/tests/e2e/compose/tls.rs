//! compose's https hop to the gateway: the files gen-env.sh makes serve it,
//! and the callers trust that CA and nothing else.

use super::{compose, gen_env_into, mounts};

const TLS_MOUNT: &str = "./docker/tls:/etc/eo/tls:ro";

/// The gateway serves https with gen-env.sh's certificate, order-api and
/// payment-service call `https://mock-gateway` trusting gen-env.sh's CA;
/// and the files gen-env.sh makes work: openssl verifies the chain for the
/// name `mock-gateway`, and a server loaded with them answers a client that
/// trusts only `ca.pem`. (Removal tried: the `subjectAltName` line out of
/// gen-env.sh — openssl's hostname check fails.)
#[tokio::test]
async fn compose_serves_the_gateway_over_https_with_gen_envs_own_ca() {
    let doc = compose();
    let services = &doc["services"];
    let env = |service: &str, var: &str| services[service]["environment"][var].as_str().map(str::to_owned);
    let gateway = &services["mock-gateway"];
    assert!(mounts(gateway).contains(&TLS_MOUNT), "{:?}", mounts(gateway));
    let cert = env("mock-gateway", "HTTP_TLS_CERT_FILE").expect("the gateway's certificate");
    let key = env("mock-gateway", "HTTP_TLS_KEY_FILE").expect("the gateway's key");
    for caller in ["order-api", "payment-service"] {
        assert!(mounts(&services[caller]).contains(&TLS_MOUNT), "{caller}");
        let url = env(caller, "GATEWAY_URL").unwrap_or_default();
        assert!(url.starts_with("https://mock-gateway:"), "{caller}: {url}");
        assert_eq!(
            env(caller, "GATEWAY_CA_FILE").as_deref(),
            Some("/etc/eo/tls/ca.pem"),
            "{caller}"
        );
        assert_eq!(env(caller, "GATEWAY_ALLOW_PLAINTEXT"), None, "{caller}");
    }

    let dir = std::env::temp_dir().join(format!("eo-gen-env-{}", uuid::Uuid::new_v4().simple()));
    gen_env_into(&dir);
    let local = |container: &str| dir.join(container.strip_prefix("/etc/eo/tls/").expect("under the mount"));
    let verify = std::process::Command::new("openssl")
        .args(["verify", "-CAfile"])
        .arg(dir.join("ca.pem"))
        .args(["-verify_hostname", "mock-gateway"])
        .arg(local(&cert))
        .output()
        .expect("openssl runs");
    assert!(
        verify.status.success(),
        "{}{}",
        String::from_utf8_lossy(&verify.stdout),
        String::from_utf8_lossy(&verify.stderr)
    );

    let limits = service_kit::ServeArgs {
        tls_cert_file: Some(local(&cert)),
        tls_key_file: Some(local(&key)),
        ..service_kit::ServeArgs::default()
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let stop = tokio_util::sync::CancellationToken::new();
    let app = axum::Router::new().route("/ok", axum::routing::get(|| async { "ok" }));
    tokio::spawn(service_kit::serve::serve(listener, app, limits, stop.clone()));
    let ca = reqwest::Certificate::from_pem(&std::fs::read(dir.join("ca.pem")).unwrap()).unwrap();
    let trusting = reqwest::Client::builder().tls_certs_only([ca]).build().unwrap();
    let answer = trusting
        .get(format!("https://127.0.0.1:{port}/ok"))
        .send()
        .await
        .expect("a client trusting gen-env.sh's CA reaches the gateway's port");
    assert_eq!(answer.text().await.unwrap(), "ok");
    stop.cancel();
    std::fs::remove_dir_all(&dir).unwrap();
}
