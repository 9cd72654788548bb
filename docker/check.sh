#!/usr/bin/env bash
# The compose path, checked by running it: a maintainer with a Docker engine
# runs this from the repository's root after changing anything compose uses.
#   bash docker/check.sh [REPORT]      # REPORT: where its log also goes
#
# On a copy of the checkout's tracked files, under a project name of its own:
# the image built (timed), then the README's compose block run as written
# (gen-env.sh, `up --build -d`, the seed's key, the order, its status), then
# what a user expects to see: the order CONFIRMED, the same request replayed
# as the same order, the order's journey, every Prometheus target up with its
# rules, spans received, every service healthy and no ERROR line in the
# logs. `down -v` at the end, whatever happened. Exits non-zero on the first
# thing that does not hold, saying which.
#
# Compose v2 (`docker compose`) or the Python docker-compose 1.29 runs it. An
# engine without BuildKit (Debian's docker.io) builds a copy of the
# Dockerfile without its cache mounts.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
report=${1:-/dev/null}
work=$(mktemp -d /tmp/eo-compose-check.XXXXXX)
export COMPOSE_PROJECT_NAME="eocheck$$"
exec > >(tee "$report") 2>&1

say() { printf '%s check: %s\n' "$(date -u +%H:%M:%S)" "$*"; }
fail() { say "FAILED: $*"; exit 1; }
if docker compose version >/dev/null 2>&1; then
    compose="docker compose"
elif command -v docker-compose >/dev/null; then
    compose="docker-compose"
else
    fail "neither 'docker compose' nor 'docker-compose' is installed"
fi
# The README's lines say `docker compose`; this runs them with what is here.
docker() { if [ "$1" = compose ]; then shift; $compose "$@"; else command docker "$@"; fi; }
# Every response also goes to a file, where the order's id is read from.
curl() { command curl "$@" | tee -a "$work/responses"; echo; }
cleanup() {
    say "down -v"
    (cd "$work/src" && $compose down -v --remove-orphans >/dev/null 2>&1) || true
    rm -rf "$work"
}
trap cleanup EXIT

say "engine: $(command docker version --format '{{.Server.Version}}'), compose: $($compose version --short 2>/dev/null || $compose version | head -n 1)"
say "commit: $(git -C "$root" rev-parse --short HEAD)$(git -C "$root" diff --quiet HEAD || echo ' (with uncommitted changes)')"
mkdir -p "$work/src"
(cd "$root" && git ls-files -z | xargs -0 tar cf -) | tar xf - -C "$work/src"
cd "$work/src"
if ! command docker buildx version >/dev/null 2>&1; then
    say "no BuildKit here: building without the Dockerfile's cache mounts"
    sed -i -e '/^# syntax=/d' -e 's/^RUN --mount=[^ ]* *\\$/RUN \\/' -e '/^ *--mount=type=cache.*\\$/d' Dockerfile
    export DOCKER_BUILDKIT=0
fi

# The image, timed apart from the rest (the README's `up --build` then finds it built).
sh docker/gen-env.sh .env
start=$(date +%s)
$compose build --quiet 2>&1 | tail -n 5
say "image built in $(( $(date +%s) - start )) s: $(command docker image inspect effectively-once:local --format '{{.Size}}' | awk '{printf "%d MB", $1/1e6}')"
rm .env

# The README's compose block, as written; {id} is the id of the order it placed.
awk '/^```sh compose$/{on=1; next} /^```/{on=0} on' README.md \
    | sed 's#{id}#$(sed -n "s|^[Ll]ocation: /orders/||p" "$work/responses" | tr -d "\\r" | tail -n 1)#g' > "$work/block.sh"
[ -s "$work/block.sh" ] || fail "the README has no \`\`\`sh compose block"
say "the README's compose block:"
sed 's/^/    /' "$work/block.sh"
start=$(date +%s)
# shellcheck source=/dev/null
. "$work/block.sh"
say "the README's block ran in $(( $(date +%s) - start )) s"
[ -n "${KEY:-}" ] || fail "the block set no KEY"
id=$(sed -n 's|^[Ll]ocation: /orders/||p' "$work/responses" | tr -d '\r' | tail -n 1)
[ -n "$id" ] || fail "the README's POST placed no order"

# The order ends CONFIRMED.
status=
for _ in $(seq 60); do
    status=$(command curl -sS -H "Authorization: Bearer $KEY" "127.0.0.1:8080/orders/$id" | sed -n 's/.*"status":"\([A-Z_]*\)".*/\1/p')
    [ "$status" = CONFIRMED ] && break
    sleep 1
done
[ "$status" = CONFIRMED ] || fail "order $id is $status, not CONFIRMED"
say "order $id: CONFIRMED"

# The same request again: the same order, replayed.
post=$(grep -m1 -A3 '^curl -i -X POST' "$work/block.sh" | tr -d '\\\n' | sed 's/^curl //')
again=$(eval "command curl -sS $post")
grep -qi '^Idempotent-Replayed: true' <<<"$again" || fail "the same request again was not replayed: $again"
grep -q "\"id\":\"$id\"" <<<"$again" || fail "the same request again answered another order: $again"
say "the same Idempotency-Key again: the same order, Idempotent-Replayed: true"

# Its journey, from the admin port inside the network.
# The operator's credential opens it; nothing else does.
refused=$($compose exec -T order-api sh -c "curl -s -o /dev/null -w '%{http_code}' http://\$ADMIN_ADDR/orders/$id/journey")
[ "$refused" = 401 ] || fail "the journey answered $refused without a credential"
journey=$($compose exec -T order-api sh -c "curl -sS -u \"operator:\$OPERATOR_KEY\" http://\$ADMIN_ADDR/orders/$id/journey")
# … and nothing on the data network reaches the admin port: from the seed's
# container (data only) order-api's API answers, its admin port does not.
from_data=$($compose run --rm -T --entrypoint sh seed -c \
    "curl -s -m 3 -o /dev/null -w '%{http_code} ' http://order-api:8080/orders; curl -s -m 3 -o /dev/null -w '%{http_code}' http://order-api:9180/health/live" || true)
[ "$from_data" = "401 000" ] || fail "from the data network, API and admin port answered: $from_data (expected 401 000)"
say "from the data network: order-api's API answers 401, its admin port nothing"
steps=$(grep -o '"kind"' <<<"$journey" | wc -l)
[ "$steps" -gt 0 ] || fail "the journey of $id has no steps: $journey"
grep -q '"missing":\[\]' <<<"$journey" || fail "the journey misses a part: $journey"
say "the order's journey: $steps steps, every part read (401 without the operator's credential)"

# Every service healthy, as the host sees it.
$compose ps
unhealthy=$($compose ps | grep -E 'unhealthy|starting|Exit [1-9]' || true)
[ -z "$unhealthy" ] || fail "not every service is healthy: $unhealthy"

# Prometheus: every target up, the alert rules loaded.
for _ in $(seq 60); do
    targets=$(command curl -sS 127.0.0.1:9090/api/v1/targets)
    up=$(grep -o '"health":"up"' <<<"$targets" | wc -l)
    all=$(grep -o '"health":"[a-z]*"' <<<"$targets" | wc -l)
    [ "$all" -gt 0 ] && [ "$up" = "$all" ] && break
    sleep 2
done
[ "$all" -gt 0 ] && [ "$up" = "$all" ] || fail "Prometheus: $up of $all targets up"
rules=$(command curl -sS 127.0.0.1:9090/api/v1/rules | grep -o '"type":"alerting"' | wc -l)
[ "$rules" -gt 0 ] || fail "Prometheus has no alerting rule"
say "Prometheus: $up of $all targets up, $rules alerting rules"

# Spans: Jaeger's own API, or the stand-in's count of OTLP posts.
if services=$(command curl -sfS 127.0.0.1:16686/api/services 2>/dev/null) && grep -q order-api <<<"$services"; then
    say "Jaeger knows: $services"
else
    posts=$($compose exec -T order-api curl -sS jaeger:4318/ | sed -n 's/.*"posts": *\([0-9]*\).*/\1/p')
    [ "${posts:-0}" -gt 0 ] || fail "no span reached Jaeger"
    say "Jaeger (a stand-in counting OTLP posts): $posts posts"
fi

# A normal start logs no ERROR.
$compose logs --no-color > "$work/logs" 2>&1
errors=$(grep -cE '"level":"ERROR"| ERROR ' "$work/logs" || true)
warnings=$(grep -E '"level":"WARN"| WARN ' "$work/logs" || true)
say "log lines: $(wc -l < "$work/logs"), ERROR: $errors, WARN: $(grep -c . <<<"$warnings" || true)"
[ -n "$warnings" ] && sed 's/^/    /' <<<"$warnings" | cut -c1-300
[ "$errors" = 0 ] || { grep -E '"level":"ERROR"| ERROR ' "$work/logs" | cut -c1-300; fail "ERROR lines in a normal start"; }
say "PASSED"
