#!/bin/sh
# PostgreSQL's first start (the postgres image runs docker-entrypoint-initdb.d
# once, on an empty data directory, as the postgres user): least privilege
# and TLS, the same layout the test stack's bootstrap makes
# (e2e/src/stack/roles.rs).
#
# - A role per service — no superuser, no CREATEDB, no CREATEROLE — owning
#   its one database; no other role may connect to it. The services create
#   nothing but their tables.
# - outbox_relay may connect to the three participants' databases; each
#   service grants it its outbox and nothing else at start
#   (OUTBOX_RELAY_ROLE, outbox::grant_relay).
# - TLS with gen-env.sh's certificate for the host `postgres`; a TCP
#   connection without TLS is refused (the services use sslmode=verify-full).
set -eu
tls=${TLS_DIR:-/etc/eo/tls}
: "${ORDER_API_DB_PASSWORD:?}" "${INVENTORY_DB_PASSWORD:?}" "${PAYMENT_DB_PASSWORD:?}"
: "${GATEWAY_DB_PASSWORD:?}" "${RELAY_DB_PASSWORD:?}"
psql -v ON_ERROR_STOP=1 --username postgres --dbname postgres \
    -v order_api="$ORDER_API_DB_PASSWORD" -v inventory="$INVENTORY_DB_PASSWORD" \
    -v payment="$PAYMENT_DB_PASSWORD" -v gateway="$GATEWAY_DB_PASSWORD" \
    -v relay="$RELAY_DB_PASSWORD" <<'SQL'
CREATE ROLE order_api LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE PASSWORD :'order_api';
CREATE ROLE inventory_service LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE PASSWORD :'inventory';
CREATE ROLE payment_service LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE PASSWORD :'payment';
CREATE ROLE mock_gateway LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE PASSWORD :'gateway';
CREATE ROLE outbox_relay LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE PASSWORD :'relay';
CREATE DATABASE orders OWNER order_api;
CREATE DATABASE inventory OWNER inventory_service;
CREATE DATABASE payments OWNER payment_service;
CREATE DATABASE gateway OWNER mock_gateway;
REVOKE ALL ON DATABASE orders, inventory, payments, gateway FROM PUBLIC;
GRANT CONNECT ON DATABASE orders, inventory, payments TO outbox_relay;
ALTER SYSTEM SET ssl = 'on';
SQL
install -m 600 "$tls/postgres-key.pem" "$PGDATA/server.key"
install -m 644 "$tls/postgres.pem" "$PGDATA/server.crt"
{ echo 'hostnossl all all all reject'; cat "$PGDATA/pg_hba.conf"; } > "$PGDATA/pg_hba.conf.new"
mv "$PGDATA/pg_hba.conf.new" "$PGDATA/pg_hba.conf"
