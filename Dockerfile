# syntax=docker/dockerfile:1
# The operator image: the Rust binary, statically linked against glibc (the gnu target with
# crt-static), on an empty base. This is the build the tests run and the benchmarks measure:
# hack/images.sh runs this builder stage's `cargo build` RUN, and `make check-image` fails when the
# image's binary is not what this file says (toolchain, target, static).
#   make docker-build IMG=...                                   this machine's platform
#   make docker-buildx IMG=... PLATFORMS=linux/amd64,linux/arm64  cross-compiled, no emulation
# Image names carry no registry: configure your container tool's registries (or mirrors) to
# resolve them.

# ---- build (on the build machine's platform, for TARGETARCH) -------------------------------
FROM --platform=$BUILDPLATFORM rust:1.95 AS builder
ARG TARGETARCH
# Another architecture needs its standard library, and a C cross compiler and libc for ring's C
# parts and the static link.
RUN case "${TARGETARCH}" in \
      amd64) arch=x86_64 gcc=gcc-x86-64-linux-gnu ;; \
      arm64) arch=aarch64 gcc=gcc-aarch64-linux-gnu ;; \
      *) echo "TARGETARCH ${TARGETARCH}: not supported (amd64, arm64)" >&2; exit 1 ;; \
    esac \
 && if [ "${arch}" != "$(uname -m)" ]; then \
      apt-get update \
      && apt-get install -y --no-install-recommends "${gcc}" "libc6-dev-${TARGETARCH}-cross" \
      && rm -rf /var/lib/apt/lists/* \
      && rustup target add "${arch}-unknown-linux-gnu"; \
    fi
ENV CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc \
    CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc \
    CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_LINKER=x86_64-linux-gnu-gcc \
    CC_x86_64_unknown_linux_gnu=x86_64-linux-gnu-gcc
WORKDIR /src
# .dockerignore admits Cargo.toml, Cargo.lock and the workspace members' sources (plus bundle/ and
# catalog/, which this build never reads).
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/src/target,sharing=locked \
    case "${TARGETARCH}" in amd64) arch=x86_64 ;; arm64) arch=aarch64 ;; esac \
 && target="${arch}-unknown-linux-gnu" \
 && RUSTFLAGS="-C target-feature=+crt-static" \
    cargo build --release --locked --target "${target}" --bin memcached-operator \
 && cp "target/${target}/release/memcached-operator" /memcached-operator \
 && printf 'nonroot:x:65532:65532:nonroot:/nonexistent:/sbin/nologin\n' >/passwd \
 && printf 'nonroot:x:65532:\n' >/group

# ---- runtime --------------------------------------------------------------------------------
FROM scratch
# VERSION, REVISION and CREATED: `make docker-build` passes the Cargo version, the git commit and
# its time (the commit's, not the build's, so that a rebuild is the same image).
ARG VERSION
ARG REVISION
ARG CREATED
LABEL org.opencontainers.image.title="memcached-operator" \
      org.opencontainers.image.description="Kubernetes operator for memcached" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://memcached-operator.example.com/source" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}"
COPY --from=builder /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=builder /passwd /etc/passwd
COPY --from=builder /group /etc/group
COPY --from=builder /memcached-operator /memcached-operator
USER 65532:65532
ENTRYPOINT ["/memcached-operator"]
