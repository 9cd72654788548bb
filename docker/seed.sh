#!/bin/sh
# The compose stack's one-shot seed (docker-compose.yml, service `seed`):
# once order-api and inventory-service are healthy, sets demo stock through
# inventory's operator endpoint and creates an API key for a demo client.
# The key alone goes to standard output (KEY=$(docker compose run --rm -T
# seed) takes another one: the stock is set, not added), what it did to
# standard error; `docker compose logs seed` shows both.
set -eu
: "${INVENTORY_URL:?}" "${INVENTORY_OPERATOR_KEY:?}" "${DATABASE_URL:?}"
client="${SEED_CLIENT:-demo-shop}"
for sku in WIDGET GADGET; do
    curl -fsS -X PUT "$INVENTORY_URL/stock/$sku" \
        -H "Authorization: Bearer $INVENTORY_OPERATOR_KEY" \
        -H 'Content-Type: application/json' \
        -d '{"available": 1000}' > /dev/null
    echo "seed: stock of $sku set to 1000" >&2
done
key=$(order-api keys create --client "$client" | tail -n 1)
echo "seed: API key for client $client (shown once; stored only as its hash):" >&2
echo "$key"
echo "seed: place an order with it (README, quick start); this log keeps it: docker compose logs seed" >&2
