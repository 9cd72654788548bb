//! Topic settings enforced at start, read back from the broker
//! (DescribeConfigs): the retention the inbox's retention chain depends on,
//! and the partition count each order's message order depends on.

use std::time::Duration;

use kafka::KafkaArgs;
use rdkafka::admin::{AdminClient, AdminOptions, AlterConfig, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::client::DefaultClientContext;
use uuid::Uuid;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_is_set_and_realigned_and_a_wrong_partition_count_is_refused() {
    // Topics of its own on the binary's shared broker.
    let broker = testkit::broker::shared().await.unwrap();
    let mut args = KafkaArgs::new(broker.clone());
    args.topic_retention_secs = 3600;
    let topic = format!("settings-{}", Uuid::new_v4().simple());
    args.ensure_topics(&[&topic]).await.unwrap();
    for t in [topic.clone(), kafka::dead_letter_topic(&topic)] {
        let config = kafka::topic_config(&broker, &t).await.unwrap();
        assert_eq!(config["retention.ms"], "3600000", "{t}");
    }

    // An operator set the retention to forever (the broker could then
    // redeliver what the inbox has forgotten) and a segment roll of its own.
    let admin: AdminClient<DefaultClientContext> = kafka::client_config(&broker).create().unwrap();
    let opts = AdminOptions::new().request_timeout(Some(Duration::from_secs(10)));
    let alter = AlterConfig::new(ResourceSpecifier::Topic(&topic))
        .set("retention.ms", "-1")
        .set("segment.ms", "600000");
    for r in admin.alter_configs([&alter], &opts).await.unwrap() {
        r.unwrap();
    }
    assert_eq!(
        kafka::topic_config(&broker, &topic).await.unwrap()["retention.ms"],
        "-1"
    );
    // The next start aligns the retention and keeps the other setting.
    args.ensure_topics(&[&topic]).await.unwrap();
    let config = kafka::topic_config(&broker, &topic).await.unwrap();
    assert_eq!(config["retention.ms"], "3600000");
    assert_eq!(config["segment.ms"], "600000");

    // A topic with another partition count is refused, by name and count.
    let odd = format!("settings-odd-{}", Uuid::new_v4().simple());
    let odd_dlq = kafka::dead_letter_topic(&odd);
    let new = [
        NewTopic::new(&odd, 5, TopicReplication::Fixed(1)),
        NewTopic::new(&odd_dlq, kafka::PARTITIONS, TopicReplication::Fixed(1)),
    ];
    for r in admin.create_topics(&new, &opts).await.unwrap() {
        r.unwrap();
    }
    let err = args.ensure_topics(&[&odd]).await.unwrap_err().to_string();
    assert!(err.contains(&odd) && err.contains("5 partitions"), "{err}");
}
