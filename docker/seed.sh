#!/bin/sh
# The compose stack's one-shot seed (docker-compose.yml, service `seed`):
# once order-api and inventory-service are healthy, sets demo stock through
# inventory's operator endpoint and creates an API key for a demo client,
# printed here. Find it again with `docker compose logs seed`; run it again
# (`docker compose run --rm seed`) for another key: the stock is set, not added.
set -eu
: "${INVENTORY_URL:?}" "${INVENTORY_OPERATOR_KEY:?}" "${DATABASE_URL:?}"
client="${SEED_CLIENT:-demo-shop}"
for sku in WIDGET GADGET; do
    curl -fsS -X PUT "$INVENTORY_URL/stock/$sku" \
        -H "Authorization: Bearer $INVENTORY_OPERATOR_KEY" \
        -H 'Content-Type: application/json' \
        -d '{"available": 1000}' > /dev/null
    echo "seed: stock of $sku set to 1000"
done
key=$(order-api keys create --client "$client" | tail -n 1)
echo "seed: API key for client $client (shown once; stored only as its hash):"
echo "$key"
echo "seed: place an order with it (README, 'The API'); this log keeps it: docker compose logs seed"
