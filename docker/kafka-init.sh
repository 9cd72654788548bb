#!/bin/bash
# One-shot, once compose's Kafka answers (docker-compose.yml's kafka-init;
# a test runs it on the host with KAFKA_HOME and the paths pointed
# elsewhere): the ACLs of each service's principal, as the super user
# admin. A consumer service reads its one topic in its own group and writes
# that topic's dead letters; the relay writes the saga's three topics; each
# keeps up the topics it uses (creates them, reads their partition count and
# settings, aligns their retention) and touches no other. The same list as
# the test stack's (e2e/src/stack/kafka_identity.rs; a test compares them).
# Adding an ACL that exists is a no-op, so this runs on every `up`.
set -eu
: "${KAFKA_HOME:=/opt/kafka}"
: "${KAFKA_BOOTSTRAP:=kafka:9092}"
: "${TLS_DIR:=/etc/eo/tls}"
: "${KAFKA_WORK:=/tmp/eo-kafka-init}"
mkdir -p "$KAFKA_WORK"
umask 077
cat > "$KAFKA_WORK/admin.properties" <<EOF
security.protocol=SASL_SSL
sasl.mechanism=SCRAM-SHA-512
sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="admin" password="${KAFKA_ADMIN_PASSWORD:?}";
ssl.truststore.type=PEM
ssl.truststore.location=$TLS_DIR/ca.pem
EOF
# allow <principal> --topic|--group <name> <operation>...
allow() {
    local principal=$1 kind=$2 name=$3
    shift 3
    local ops=()
    for op in "$@"; do ops+=(--operation "$op"); done
    "$KAFKA_HOME/bin/kafka-acls.sh" --bootstrap-server "$KAFKA_BOOTSTRAP" \
        --command-config "$KAFKA_WORK/admin.properties" \
        --add --allow-principal "User:$principal" "$kind" "$name" "${ops[@]}" > /dev/null
    echo "User:$principal may $* on $name"
}
upkeep="Create Describe DescribeConfigs AlterConfigs"
allow order-api --topic order.events Read $upkeep
allow order-api --topic order.events.dlq Write $upkeep
allow order-api --group order-saga Read
allow inventory-service --topic inventory.commands Read $upkeep
allow inventory-service --topic inventory.commands.dlq Write $upkeep
allow inventory-service --group inventory-service Read
allow payment-service --topic payment.commands Read $upkeep
allow payment-service --topic payment.commands.dlq Write $upkeep
allow payment-service --group payment-service Read
allow outbox-relay --topic inventory.commands Write $upkeep
allow outbox-relay --topic payment.commands Write $upkeep
allow outbox-relay --topic order.events Write $upkeep
