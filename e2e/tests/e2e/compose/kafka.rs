//! compose's Kafka as docker/kafka-start.sh and docker/kafka-init.sh leave
//! it, run on this machine (no Docker engine here) with the harness's Kafka
//! jars standing in for the image's `bin/`: SASL/SCRAM-SHA-512 over TLS
//! with gen-env.sh's certificate, a principal per service with the
//! passwords .env holds, and exactly the ACLs of the test stack — and
//! docker-compose.yml gives each Kafka client service its own principal.

use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt as _;
use std::time::Duration;

use e2e::Service;
use testkit::broker::acl::{Operation, Resource};

use super::{compose, gen_env_into};

/// The ACLs docker/kafka-init.sh creates, read from its `allow` lines.
fn script_acls() -> BTreeSet<(String, Resource, Operation)> {
    let text = include_str!("../../../../docker/kafka-init.sh");
    let upkeep = ["Create", "Describe", "DescribeConfigs", "AlterConfigs"];
    let mut acls = BTreeSet::new();
    for line in text.lines().filter_map(|l| l.strip_prefix("allow ")) {
        let words: Vec<&str> = line.split_whitespace().collect();
        let resource = match words[1] {
            "--topic" => Resource::Topic(words[2].into()),
            "--group" => Resource::Group(words[2].into()),
            other => panic!("{other} in {line}"),
        };
        for op in words[3..]
            .iter()
            .flat_map(|w| if *w == "$upkeep" { upkeep.to_vec() } else { vec![*w] })
        {
            let op = [
                Operation::Read,
                Operation::Write,
                Operation::Create,
                Operation::Describe,
                Operation::DescribeConfigs,
                Operation::AlterConfigs,
            ]
            .into_iter()
            .find(|o| o.name() == op)
            .unwrap_or_else(|| panic!("{op} in {line}"));
            acls.insert((words[0].to_owned(), resource.clone(), op));
        }
    }
    acls
}

/// `KAFKA_HOME/bin` standing in for the image's: each script the compose
/// scripts call runs its class from the harness's jars.
fn kafka_home(dir: &std::path::Path) -> std::path::PathBuf {
    let libs = testkit::broker::ensure().unwrap();
    let bin = dir.join("kafka-home/bin");
    std::fs::create_dir_all(&bin).unwrap();
    for (script, class, opts) in [
        ("kafka-storage.sh", "kafka.tools.StorageTool", "-Xmx256m"),
        (
            "kafka-server-start.sh",
            "kafka.Kafka",
            testkit::broker::DEFAULT_JVM_OPTS,
        ),
        ("kafka-acls.sh", "org.apache.kafka.tools.AclCommand", "-Xmx256m"),
    ] {
        let path = bin.join(script);
        std::fs::write(
            &path,
            format!(
                "#!/bin/sh\nexec java {opts} -XX:+UseSerialGC -cp '{}/*' {class} \"$@\"\n",
                libs.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    dir.join("kafka-home")
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Removals tried: `allow order-api --group order-saga Read` out of
/// docker/kafka-init.sh, and `allow order-api --topic payment.commands
/// Write` added to it — each time the list differed from the stack's and
/// this failed there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compose_kafka_has_a_principal_per_service_and_the_stacks_acls() {
    // A Kafka node of its own: not beside a chaos run, whose rate it would slow.
    let _share = crate::share().await;
    // Each Kafka client service signs in as itself, with its own password.
    let doc = compose();
    let env = |service: &str, var: &str| {
        doc["services"][service]["environment"][var]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };
    let password_var = |s: Service| match s {
        Service::OrderApi => "ORDER_API_KAFKA_PASSWORD",
        Service::Inventory => "INVENTORY_KAFKA_PASSWORD",
        Service::Payment => "PAYMENT_KAFKA_PASSWORD",
        _ => "RELAY_KAFKA_PASSWORD",
    };
    for s in [Service::OrderApi, Service::Inventory, Service::Payment, Service::Relay] {
        assert_eq!(env(s.name(), "KAFKA_SASL_USERNAME"), s.name());
        assert_eq!(
            env(s.name(), "KAFKA_SASL_PASSWORD"),
            format!("${{{}:?}}", password_var(s))
        );
        assert_eq!(env(s.name(), "KAFKA_CA_FILE"), "/etc/eo/tls/ca.pem");
        assert!(
            env("kafka", password_var(s)).contains(password_var(s)),
            "the broker gets {}",
            password_var(s)
        );
    }
    // The same ACLs as the test stack's.
    let stack: BTreeSet<_> = e2e::stack::kafka_acls()
        .into_iter()
        .map(|a| (a.principal, a.resource, a.operation))
        .collect();
    assert_eq!(script_acls(), stack, "docker/kafka-init.sh and the stack's ACLs differ");

    // The scripts themselves, with gen-env.sh's files.
    let dir = std::env::temp_dir().join(format!("eo-compose-kafka-{}", uuid::Uuid::new_v4().simple()));
    let tls = dir.join("tls");
    let dotenv = gen_env_into(&tls);
    let vars: Vec<(String, String)> = dotenv
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    let var = |name: &str| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone()).unwrap();
    let home = kafka_home(&dir);
    let (port, controller, host_port) = (free_port(), free_port(), free_port());
    let script = |name: &str| {
        let mut c = tokio::process::Command::new("bash");
        c.arg(format!("{}/../docker/{name}", env!("CARGO_MANIFEST_DIR")))
            .envs(vars.iter().cloned())
            .env("KAFKA_HOME", &home)
            .env("TLS_DIR", &tls)
            .env("KAFKA_HOST", "localhost")
            .env("KAFKA_BIND", "127.0.0.1")
            .env("KAFKA_PORT", port.to_string())
            .env("KAFKA_CONTROLLER_PORT", controller.to_string())
            .env("KAFKA_HOST_PORT", host_port.to_string())
            .env("KAFKA_BOOTSTRAP", format!("localhost:{port}"))
            .env("KAFKA_DATA", dir.join("data"))
            .kill_on_drop(true);
        c
    };
    let log = std::fs::File::create(dir.join("kafka.log")).unwrap();
    let mut kafka = script("kafka-start.sh")
        .env("KAFKA_WORK", dir.join("work"))
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    let ca = tls.join("ca.pem");
    let as_user = |user: &str, password: &str, p: u16| {
        kafka::KafkaArgs::new(format!("localhost:{p}")).with_sasl(
            user,
            credentials::Secret::new(password).unwrap(),
            &ca,
        )
    };
    let admin = as_user("admin", &var("KAFKA_ADMIN_PASSWORD"), port);
    testkit::broker::wait_ready(&kafka::Connect::client_config(&admin), 1, Duration::from_secs(120))
        .await
        .unwrap_or_else(|e| panic!("{e}: {}", std::fs::read_to_string(dir.join("kafka.log")).unwrap()));
    let init = script("kafka-init.sh")
        .env("KAFKA_WORK", dir.join("init"))
        .output()
        .await
        .unwrap();
    assert!(init.status.success(), "{}", String::from_utf8_lossy(&init.stderr));

    // The host listener takes the admin too (tools on the host).
    let host_admin = as_user("admin", &var("KAFKA_ADMIN_PASSWORD"), host_port);
    testkit::broker::wait_ready(&kafka::Connect::client_config(&host_admin), 1, Duration::from_secs(10))
        .await
        .unwrap();
    // order-api keeps up its own topics, and may not write a charge.
    let order_api = as_user("order-api", &var("ORDER_API_KAFKA_PASSWORD"), port);
    kafka::ensure_topics(&order_api, &["order.events"]).await.unwrap();
    kafka::ensure_topics(&admin, &["payment.commands"]).await.unwrap();
    let producer: rdkafka::producer::FutureProducer = kafka::Connect::client_config(&order_api)
        .set("enable.idempotence", "false")
        .set("message.timeout.ms", "10000")
        .create()
        .unwrap();
    let record = rdkafka::producer::FutureRecord::to("payment.commands")
        .key("forged")
        .payload("{}");
    let refused = producer.send(record, Duration::from_secs(10)).await;
    assert!(
        matches!(
            refused,
            Err((
                rdkafka::error::KafkaError::MessageProduction(
                    rdkafka::error::RDKafkaErrorCode::TopicAuthorizationFailed
                ),
                _
            ))
        ),
        "order-api writing payment.commands: {refused:?}"
    );
    // A client without TLS and credentials gets nothing.
    let stranger: rdkafka::consumer::BaseConsumer = kafka::client_config(&format!("localhost:{port}"))
        .set("log_level", "0")
        .create()
        .unwrap();
    assert!(rdkafka::consumer::Consumer::fetch_metadata(&stranger, None, Duration::from_secs(5)).is_err());

    kafka.kill().await.unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}
