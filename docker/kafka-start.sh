#!/bin/bash
# Starts compose's Kafka node with identities (docker-compose.yml's kafka
# service runs this in the apache/kafka image; a test runs it on the host
# with KAFKA_HOME and the paths pointed elsewhere):
# - CLIENT (:9092, the compose network) and HOST (:19092, published on the
#   host's loopback for tools) take SASL/SCRAM-SHA-512 over TLS only;
# - CONTROLLER (:9093) takes TLS with a client certificate only;
# - the StandardAuthorizer allows a principal only what an ACL grants it
#   (docker/kafka-init.sh creates them); `broker` (replication), `admin`
#   (operators, kafka-init) and the node's own certificate are super users;
# - the SCRAM users are created when the storage is first formatted, with
#   the passwords in .env (gen-env.sh), so they exist before any client.
# Nothing secret is written outside the container's /tmp and the log volume.
set -eu
: "${KAFKA_HOME:=/opt/kafka}"
: "${KAFKA_DATA:=/var/lib/kafka/data}"
: "${KAFKA_WORK:=/tmp/eo-kafka}"
: "${TLS_DIR:=/etc/eo/tls}"
: "${KAFKA_HOST:=kafka}"
: "${KAFKA_BIND:=}"
: "${KAFKA_PORT:=9092}"
: "${KAFKA_CONTROLLER_PORT:=9093}"
: "${KAFKA_HOST_PORT:=19092}"
: "${KAFKA_CLUSTER_ID:?set by gen-env.sh}"
users="broker:${KAFKA_BROKER_PASSWORD:?} admin:${KAFKA_ADMIN_PASSWORD:?}
order-api:${ORDER_API_KAFKA_PASSWORD:?} inventory-service:${INVENTORY_KAFKA_PASSWORD:?}
payment-service:${PAYMENT_KAFKA_PASSWORD:?} outbox-relay:${RELAY_KAFKA_PASSWORD:?}"

mkdir -p "$KAFKA_WORK" "$KAFKA_DATA"
umask 077
# The node's keystore: its key and certificate in one PEM file.
cat "$TLS_DIR/kafka-key.pem" "$TLS_DIR/kafka.pem" > "$KAFKA_WORK/keystore.pem"
cat > "$KAFKA_WORK/server.properties" <<EOF
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@$KAFKA_HOST:$KAFKA_CONTROLLER_PORT
listeners=CLIENT://$KAFKA_BIND:$KAFKA_PORT,CONTROLLER://$KAFKA_BIND:$KAFKA_CONTROLLER_PORT,HOST://$KAFKA_BIND:$KAFKA_HOST_PORT
advertised.listeners=CLIENT://$KAFKA_HOST:$KAFKA_PORT,HOST://127.0.0.1:$KAFKA_HOST_PORT
controller.listener.names=CONTROLLER
inter.broker.listener.name=CLIENT
listener.security.protocol.map=CLIENT:SASL_SSL,HOST:SASL_SSL,CONTROLLER:SSL
sasl.enabled.mechanisms=SCRAM-SHA-512
sasl.mechanism.inter.broker.protocol=SCRAM-SHA-512
listener.name.client.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="broker" password="$KAFKA_BROKER_PASSWORD";
listener.name.host.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.controller.ssl.client.auth=required
ssl.keystore.type=PEM
ssl.keystore.location=$KAFKA_WORK/keystore.pem
ssl.truststore.type=PEM
ssl.truststore.location=$TLS_DIR/ca.pem
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
allow.everyone.if.no.acl.found=false
super.users=User:broker;User:admin;User:CN=kafka
log.dirs=$KAFKA_DATA
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=false
EOF
# What the healthcheck and kafka-init.sh connect with: admin on CLIENT.
cat > "$KAFKA_WORK/admin.properties" <<EOF
security.protocol=SASL_SSL
sasl.mechanism=SCRAM-SHA-512
sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="admin" password="$KAFKA_ADMIN_PASSWORD";
ssl.truststore.type=PEM
ssl.truststore.location=$TLS_DIR/ca.pem
EOF
if [ ! -f "$KAFKA_DATA/meta.properties" ]; then
    set -- --ignore-formatted --cluster-id="$KAFKA_CLUSTER_ID" --config="$KAFKA_WORK/server.properties"
    for u in $users; do
        set -- "$@" "--add-scram=SCRAM-SHA-512=[name=${u%%:*},password=${u#*:}]"
    done
    "$KAFKA_HOME/bin/kafka-storage.sh" format "$@"
fi
exec "$KAFKA_HOME/bin/kafka-server-start.sh" "$KAFKA_WORK/server.properties"
