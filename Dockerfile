# syntax=docker/dockerfile:1

# jobfence images: one build stage, then one small image per command, each a
# target of this file:
#
#   docker build --target coordinator  -t jobfence/coordinator  .
#   docker build --target fakeprovider -t jobfence/fakeprovider .
#   docker build --target refundworker -t jobfence/refundworker .
#
# A plain `docker build .` gives the coordinator (the last stage). The images
# are static Go binaries on distroless (no shell, no package manager) running
# as the unprivileged user nonroot (65532). docker-compose.yml builds all three;
# docs/DEPLOY.md explains the setup.

# go.mod asks for Go 1.26.8. The build uses the image's own toolchain
# (GOTOOLCHAIN=local), so the image must be at least that version.
ARG GO_VERSION=1.26.8

FROM golang:${GO_VERSION} AS build
# Static binaries: the SQLite driver (modernc.org/sqlite) is pure Go.
ENV CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-trimpath
WORKDIR /src

# The gRPC health probe for the coordinator's container health check (the
# runtime image has no shell and no curl). Before the source: it changes less.
ARG GRPC_HEALTH_PROBE_VERSION=v0.4.62
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    GOBIN=/out go install -ldflags='-s -w' \
    github.com/grpc-ecosystem/grpc-health-probe@${GRPC_HEALTH_PROBE_VERSION}

# The workspace (go.work) of three modules: the coordinator, gen/ and the Go
# SDK (clients/go/README.md says why).
COPY go.work go.work.sum go.mod go.sum ./
COPY gen/go.mod gen/go.sum gen/
COPY clients/go/go.mod clients/go/go.sum clients/go/
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    go build -ldflags='-s -w' -o /out/ ./cmd/coordinator ./cmd/fakeprovider ./cmd/refundworker

# What every image shares: CA certificates, tzdata, /etc/passwd with nonroot.
FROM gcr.io/distroless/static-debian12:nonroot AS runtime
USER nonroot:nonroot
# Writable by nonroot: the embedded store's default file data/jobfence.db
# lands here when a coordinator runs without --mysql-dsn.
WORKDIR /home/nonroot

# The simulated payment provider, for demos and chaos tests only.
FROM runtime AS fakeprovider
COPY --from=build /out/fakeprovider /usr/local/bin/fakeprovider
ENV FAKEPROVIDER_LISTEN=0.0.0.0:8099
EXPOSE 8099
ENTRYPOINT ["/usr/local/bin/fakeprovider"]

# The example worker. It serves nothing, so it exposes nothing.
FROM runtime AS refundworker
COPY --from=build /out/refundworker /usr/local/bin/refundworker
ENTRYPOINT ["/usr/local/bin/refundworker"]

FROM runtime AS coordinator
COPY --from=build /out/coordinator /out/grpc-health-probe /usr/local/bin/
# Inside a container loopback reaches nobody, so listen on every interface.
# The coordinator then refuses to start without --tokens-file or
# --tls-client-ca: an image run with no credentials fails loudly instead of
# serving refunds to anyone.
ENV JOBFENCE_LISTEN=0.0.0.0:50051
# gRPC; Prometheus metrics when --metrics-listen=0.0.0.0:9090 is given.
EXPOSE 50051 9090
# No HEALTHCHECK here: how to probe depends on the TLS flags the image is run
# with. docker-compose.yml probes with
#   grpc-health-probe -addr=127.0.0.1:50051 [-tls -tls-ca-cert=…]
# and Kubernetes has gRPC probes of its own.
ENTRYPOINT ["/usr/local/bin/coordinator"]
