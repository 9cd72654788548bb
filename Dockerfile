# syntax=docker/dockerfile:1
# One image for the five services; docker-compose.yml picks the binary.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
# BuildKit cache mounts: the registry and the target directory (compiled
# dependencies, librdkafka included) outlive the build, so a change to the
# project's code rebuilds the project's crates only. The binaries are copied
# out of the cache mount in the same step.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked \
        -p order-api -p outbox-relay -p inventory-service -p payment-service -p mock-gateway \
    && mkdir -p /out \
    && cp target/release/order-api target/release/outbox-relay target/release/inventory-service \
          target/release/payment-service target/release/mock-gateway /out/

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates curl && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/order-api \
                  /out/outbox-relay \
                  /out/inventory-service \
                  /out/payment-service \
                  /out/mock-gateway \
                  /usr/local/bin/
ENV LOG_FORMAT=json RUST_LOG=info
USER nobody
