//! The services' secrets as compose and the binaries take them: `--help`
//! never prints one, and a service without one refuses to start.

use clap::CommandFactory;

/// `--help` shows the environment's values next to each variable unless an
/// argument hides them: every secret and every database URL (which may hold
/// a password) hides its value.
#[test]
fn help_prints_no_secret_and_no_database_url_from_the_environment() {
    fn check<C: CommandFactory>(name: &str) -> usize {
        // clap's own consistency checks (unique argument ids across the
        // flattened groups, …), which otherwise run only when a binary starts.
        C::command().debug_assert();
        let mut hidden = 0;
        for arg in C::command().get_arguments() {
            let Some(env) = arg.get_env().map(|e| e.to_string_lossy().into_owned()) else {
                continue;
            };
            let sensitive = [
                "DATABASE_URL",
                "OUTBOX_DATABASE_URLS",
                "GATEWAY_VAULT_KEY",
                "IDEMPOTENCY_FINGERPRINT_KEY",
                "GATEWAY_API_KEY",
                "GATEWAY_CLIENTS",
                "OPERATOR_KEY",
                "OPERATOR_KEY_PREVIOUS",
                "ADMIN_READERS",
                "PARTICIPANTS_ADMIN_KEY",
            ]
            .contains(&env.as_str());
            if sensitive {
                assert!(arg.is_hide_env_values_set(), "{name}: --help would print ${env}");
                hidden += 1;
            }
        }
        hidden
    }
    let hidden = check::<order_api::Config>("order-api")
        + check::<inventory_service::Config>("inventory-service")
        + check::<payment_service::Config>("payment-service")
        + check::<mock_gateway::Config>("mock-gateway")
        + check::<outbox_relay::Config>("outbox-relay");
    // 5 database URLs, 2 fingerprint keys, 2 gateway credentials, the
    // gateway's callers and vault key; order-api's, inventory's and
    // payment's operator keys (new and previous) and admin readers;
    // order-api's key at the participants' admin ports.
    assert_eq!(hidden, 21, "sensitive variables found");
}

/// A service started without its secrets (an empty environment: no
/// defaults exist to fall back on) refuses to start and names each
/// missing variable, its Kafka principal's too; a secret shorter than 32
/// characters is refused too,
/// and so is a plain `http://` gateway (card numbers in clear). Removal
/// tried: the scheme check out of `GatewayArgs::client` — each goes on to
/// the database and fails there, naming no scheme, and this fails.
#[test]
fn a_service_without_its_secrets_refuses_to_start_and_names_them() {
    let bin = e2e::stack::default_bin_dir().expect("the services' binaries");
    let required: [(&str, &[&str]); 4] = [
        (
            "order-api",
            &["GATEWAY_API_KEY", "IDEMPOTENCY_FINGERPRINT_KEY", "OPERATOR_KEY"],
        ),
        ("payment-service", &["GATEWAY_API_KEY", "OPERATOR_KEY"]),
        ("inventory-service", &["OPERATOR_KEY"]),
        (
            "mock-gateway",
            &["GATEWAY_CLIENTS", "GATEWAY_VAULT_KEY", "IDEMPOTENCY_FINGERPRINT_KEY"],
        ),
    ];
    for (service, vars) in required {
        let out = std::process::Command::new(bin.join(service))
            .env_clear()
            .output()
            .unwrap_or_else(|e| panic!("{service}: {e} (build the services first)"));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{service} started without secrets: {err}");
        for var in vars {
            assert!(err.contains(var), "{service} does not name {var}: {err}");
        }
    }
    // With those, a Kafka client service still needs its principal at the
    // brokers (or KAFKA_PLAINTEXT, said out loud).
    for (service, vars) in &required[..3] {
        let out = std::process::Command::new(bin.join(service))
            .env_clear()
            .envs(vars.iter().map(|v| (*v, "s".repeat(32))))
            .env("DATABASE_URL", "postgres://nobody@127.0.0.1:9/none")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{service} started without Kafka credentials: {err}"
        );
        assert!(
            err.contains("KAFKA_SASL_USERNAME") && err.contains("KAFKA_SASL_PASSWORD"),
            "{service}: {err}"
        );
    }
    let out = std::process::Command::new(bin.join("inventory-service"))
        .env_clear()
        .env("OPERATOR_KEY", "too-short")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("OPERATOR_KEY") && err.contains("32"), "{err}");
    assert!(!err.contains("too-short"), "the refused value is echoed: {err}");
    // A plain http gateway is refused before any connection is tried,
    // unless allowed by name.
    for service in ["order-api", "payment-service"] {
        let out = std::process::Command::new(bin.join(service))
            .env_clear()
            .env("GATEWAY_URL", "http://127.0.0.1:9")
            .env("KAFKA_PLAINTEXT", "true")
            .env("GATEWAY_API_KEY", "k".repeat(32))
            .env("IDEMPOTENCY_FINGERPRINT_KEY", "f".repeat(32))
            .env("OPERATOR_KEY", "o".repeat(32))
            .env("DATABASE_URL", "postgres://nobody@127.0.0.1:9/none")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{service} started with a plain http gateway");
        assert!(
            err.contains("GATEWAY_URL http://127.0.0.1:9 is plain http") && err.contains("GATEWAY_ALLOW_PLAINTEXT"),
            "{service}: {err}"
        );
    }
}
