#!/bin/sh
# Prints the secrets docker-compose.yml reads, freshly generated:
#   sh docker/gen-env.sh > .env
# .env is ignored by git and by docker builds. Keep it: a new vault key gives
# known cards new tokens, a new fingerprint key makes retries of requests
# sent before the change a 422, new credentials must reach both sides.
set -eu
secret() { od -An -N32 -tx1 /dev/urandom | tr -d ' \n'; }
echo "POSTGRES_PASSWORD=$(secret)"
echo "GATEWAY_VAULT_KEY=$(secret)"
echo "GATEWAY_FINGERPRINT_KEY=$(secret)"
echo "ORDER_API_FINGERPRINT_KEY=$(secret)"
echo "ORDER_API_GATEWAY_KEY=$(secret)"
echo "PAYMENT_GATEWAY_KEY=$(secret)"
echo "INVENTORY_OPERATOR_KEY=$(secret)"
echo "GRAFANA_ADMIN_PASSWORD=$(secret)"
