# One image for the five services; docker-compose.yml picks the binary.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked \
        -p order-api -p outbox-relay -p inventory-service -p payment-service -p mock-gateway

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates curl && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/order-api \
                  /src/target/release/outbox-relay \
                  /src/target/release/inventory-service \
                  /src/target/release/payment-service \
                  /src/target/release/mock-gateway \
                  /usr/local/bin/
ENV LOG_FORMAT=json RUST_LOG=info
USER nobody
