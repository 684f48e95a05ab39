# syntax=docker/dockerfile:1
# The csi-provisioner sidecar: a static binary on distroless, as nonroot.
#
#   docker build --build-arg VERSION=v0.1.0 -t csi-provisioner:v0.1.0 .   # or: make image
#
# Multi-arch: docker buildx build --platform linux/amd64,linux/arm64 ... (the
# builder cross-compiles; nothing runs on the target platform).

FROM --platform=$BUILDPLATFORM golang:1.26 AS build
ARG TARGETOS=linux
ARG TARGETARCH
ARG VERSION=dev
WORKDIR /src
# Dependencies first, so a source change does not download them again.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -buildvcs=false -tags grpcnotrace -ldflags "-s -w -X main.version=${VERSION}" \
      -o /out/csi-provisioner ./cmd/csi-provisioner

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/csi-provisioner /csi-provisioner
# The sidecar needs no privileges: it talks to the driver over a unix socket
# in a shared emptyDir and to the API server over HTTPS.
USER 65532:65532
ENTRYPOINT ["/csi-provisioner"]
