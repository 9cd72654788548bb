#!/bin/sh
# The secrets docker-compose.yml reads, freshly generated:
#   sh docker/gen-env.sh .env    # writes .env; refuses when it exists
#   sh docker/gen-env.sh         # prints them
# .env is ignored by git and by docker builds. Keep it: a new vault key gives
# known cards new tokens, a new fingerprint key makes retries of requests
# sent before the change a 422, new credentials must reach both sides, and
# the database roles' passwords are set once, when PostgreSQL's volume is
# first initialised (docker/postgres-init.sh).
#
# It also makes the stack's private certificate authority and three server
# certificates signed by it (openssl) in $TLS_DIR (default docker/tls,
# ignored by git): the gateway's (https), PostgreSQL's (TLS, the services
# connect with sslmode=verify-full) and Kafka's (its listeners' TLS, and
# its client certificate on the controller listener); the services trust
# ca.pem only. Kafka's SCRAM passwords are set when its volume is first
# formatted (docker/kafka-start.sh).
# The CA's key is not kept: a new certificate takes a new run of this script.
set -eu
target=${1:-}
if [ -n "$target" ] && [ -s "$target" ]; then
    cat >&2 <<EOF
gen-env.sh: $target exists, and compose's volumes keep the passwords it was
made with: a new one would make every login fail. To start over:
    docker compose down -v && rm $target && sh docker/gen-env.sh $target
EOF
    exit 1
fi
command -v openssl >/dev/null || { echo "gen-env.sh: openssl not found (1.1.1 or later is needed)" >&2; exit 1; }
# ssl <args>: openssl, quiet when it works, its own message when it does not.
ssl() {
    if ! out=$(openssl "$@" 2>&1); then
        printf 'gen-env.sh: openssl %s failed:\n%s\n' "$1" "$out" >&2
        exit 1
    fi
}
secret() { od -An -N32 -tx1 /dev/urandom | tr -d ' \n'; }
tls_dir=${TLS_DIR:-$(dirname "$0")/tls}
mkdir -p "$tls_dir"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [ -n "$target" ]; then
    # Everything below goes to the file, whole or not at all.
    TLS_DIR=$tls_dir sh "$0" > "$work/env"
    mv "$work/env" "$target"
    echo "gen-env.sh: wrote $target and $tls_dir" >&2
    exit 0
fi
ssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 825 \
    -subj "/CN=effectively-once compose CA" -keyout "$work/ca-key.pem" -out "$tls_dir/ca.pem" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"
# issue <name> [usage]: <name>.pem and <name>-key.pem (PKCS#8) for the host
# <name> (and loopback), for serverAuth or the extended key usage given.
issue() {
    ssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$1" \
        -keyout "$tls_dir/$1-key.pem" -out "$work/$1.csr"
    printf 'subjectAltName=DNS:%s,DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=%s\n' "$1" "${2:-serverAuth}" \
        > "$work/$1.ext"
    ssl x509 -req -in "$work/$1.csr" -CA "$tls_dir/ca.pem" -CAkey "$work/ca-key.pem" \
        -set_serial "0x$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')" \
        -days 825 -extfile "$work/$1.ext" -out "$tls_dir/$1.pem"
    # Read inside the containers by their own users (nobody, postgres).
    chmod 644 "$tls_dir/$1-key.pem"
}
issue mock-gateway
issue postgres
issue kafka serverAuth,clientAuth
echo "POSTGRES_PASSWORD=$(secret)"
echo "ORDER_API_DB_PASSWORD=$(secret)"
echo "INVENTORY_DB_PASSWORD=$(secret)"
echo "PAYMENT_DB_PASSWORD=$(secret)"
echo "GATEWAY_DB_PASSWORD=$(secret)"
echo "RELAY_DB_PASSWORD=$(secret)"
echo "GATEWAY_VAULT_KEY=$(secret)"
echo "GATEWAY_FINGERPRINT_KEY=$(secret)"
echo "ORDER_API_FINGERPRINT_KEY=$(secret)"
echo "ORDER_API_GATEWAY_KEY=$(secret)"
echo "PAYMENT_GATEWAY_KEY=$(secret)"
echo "INVENTORY_OPERATOR_KEY=$(secret)"
echo "ORDER_API_OPERATOR_KEY=$(secret)"
echo "PAYMENT_OPERATOR_KEY=$(secret)"
echo "ORDER_API_READER_KEY=$(secret)"
echo "GRAFANA_ADMIN_PASSWORD=$(secret)"
echo "KAFKA_CLUSTER_ID=$(openssl rand -base64 16 | tr '+/' '-_' | tr -d '=\n')"
echo "KAFKA_BROKER_PASSWORD=$(secret)"
echo "KAFKA_ADMIN_PASSWORD=$(secret)"
echo "ORDER_API_KAFKA_PASSWORD=$(secret)"
echo "INVENTORY_KAFKA_PASSWORD=$(secret)"
echo "PAYMENT_KAFKA_PASSWORD=$(secret)"
echo "RELAY_KAFKA_PASSWORD=$(secret)"
