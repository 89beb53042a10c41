# rangesvc's container image: a static binary on an empty base, run as a
# non-root user, no shell. Build:
#
#   docker build --build-arg VERSION=v1.2.3 -t idrange/rangesvc:v1.2.3 .
#
# Without Docker (CI does this): go run ./internal/tools/mkimage -version v1.2.3
# -tar rangesvc.tar -verify, then `docker load -i` / `podman load -i` it, or
# push the OCI layout (-oci DIR) with skopeo or crane. The two give the same
# image layout; a test (internal/tools/mkimage TestDockerfileMatches) keeps
# this file in step with the builder.
# docs/operations/deploy.md, "Container image and Kubernetes".

FROM golang:1.26 AS build
WORKDIR /src
# Modules first, so a source change does not download them again.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=devel
RUN CGO_ENABLED=0 GOOS=linux go build -trimpath \
      -ldflags "-s -w -X github.com/idrange/idrange/internal/server/buildinfo.Version=${VERSION}" \
      -o /out/rangesvc ./cmd/rangesvc

FROM scratch
ARG VERSION=devel
COPY --from=build /out/rangesvc /rangesvc
USER 65532:65532
EXPOSE 7070 7071 9090
LABEL org.opencontainers.image.title="rangesvc" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.source="https://github.com/idrange/idrange" \
      org.opencontainers.image.licenses="Apache-2.0"
ENTRYPOINT ["/rangesvc"]
