# syntax=docker/dockerfile:1
# The operator image: a static (musl) build of the Rust binary on an empty base.
#   docker build -t memcached-operator:0.2.0 .        (make docker-build IMG=...)
# Image names carry no registry: configure your container tool's registries (or mirrors) to
# resolve them.

# ---- build ----------------------------------------------------------------------------------
FROM rust:1.95 AS builder
# musl-tools: the C parts of ring (TLS) are compiled with musl-gcc for a fully static binary.
RUN apt-get update \
 && apt-get install -y --no-install-recommends musl-tools \
 && rm -rf /var/lib/apt/lists/*
RUN rustup target add "$(uname -m)-unknown-linux-musl"
WORKDIR /src
# .dockerignore admits Cargo.toml, Cargo.lock and the workspace members' sources (plus bundle/ and
# catalog/, which this build never reads).
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/src/target,sharing=locked \
    target="$(uname -m)-unknown-linux-musl" \
 && cargo build --release --locked --target "${target}" --bin memcached-operator \
 && cp "target/${target}/release/memcached-operator" /memcached-operator \
 && printf 'nonroot:x:65532:65532:nonroot:/nonexistent:/sbin/nologin\n' >/passwd \
 && printf 'nonroot:x:65532:\n' >/group

# ---- runtime --------------------------------------------------------------------------------
FROM scratch
LABEL org.opencontainers.image.title="memcached-operator" \
      org.opencontainers.image.description="Kubernetes operator for memcached" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=builder /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=builder /passwd /etc/passwd
COPY --from=builder /group /etc/group
COPY --from=builder /memcached-operator /memcached-operator
USER 65532:65532
ENTRYPOINT ["/memcached-operator"]
