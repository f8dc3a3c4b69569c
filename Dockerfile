# syntax=docker/dockerfile:1
#
# palisade: one static binary (controller, CLI, kubectl plugin) on distroless, as non-root.
#
#   docker build -t ghcr.io/palisade-dev/palisade:0.1.0 .
#
# The tag should match the chart's appVersion (charts/palisade/Chart.yaml), which the
# chart uses as its default image tag. Multi-arch: `docker buildx build --platform
# linux/amd64,linux/arm64 ...` works as is (the alpine stage builds for its own arch).

ARG RUST_VERSION=1.95

# --- build: the Rust alpine image targets musl, so the binary is statically linked --------
FROM rust:${RUST_VERSION}-alpine AS build
RUN apk add --no-cache musl-dev binutils
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY sql ./sql
COPY benches ./benches
COPY tests ./tests
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin palisade \
 && install -m 0755 target/release/palisade /palisade \
 && strip /palisade \
 && if readelf -lW /palisade | grep -q 'program interpreter'; then \
      echo 'palisade is dynamically linked; expected a static binary' >&2; exit 1; \
    fi \
 && /palisade --version

# --- runtime: no shell, no package manager, uid/gid 65532 ----------------------------------
FROM gcr.io/distroless/static-debian12:nonroot
LABEL org.opencontainers.image.title="palisade" \
      org.opencontainers.image.description="Kubernetes leases with fencing tokens" \
      org.opencontainers.image.source="https://github.com/palisade-dev/palisade" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /palisade /palisade
USER 65532:65532
ENTRYPOINT ["/palisade"]
CMD ["controller"]
