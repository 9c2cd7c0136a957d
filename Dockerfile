# A small image of the operator's CLI: a static pgbaton (CGO_ENABLED=0)
# on distroless/static (CA certificates and tzdata for TLS to PostgreSQL,
# no shell, runs as nonroot). Build from the repository root:
#
#   docker build -t pgbaton --build-arg VERSION=$(git describe --tags) .
#   docker run --rm -e PGBATON_DSN=postgres://oncall@db1/app pgbaton locks
#
# The build stage runs `make build-static`, the same target CI runs, so the
# binary in the image is the one CI proved static.

ARG GO_VERSION=1.26.8

FROM golang:${GO_VERSION}-bookworm AS build
WORKDIR /src
# Module files first: the download layer is cached until a go.mod changes.
COPY go.work go.work.sum go.mod go.sum ./
COPY admin/go.mod admin/go.sum admin/
COPY bench/go.mod bench/go.sum bench/
COPY cmd/pgbaton/go.mod cmd/pgbaton/go.sum cmd/pgbaton/
COPY examples/demo/go.mod examples/demo/go.sum examples/demo/
COPY gocronlock/go.mod gocronlock/go.sum gocronlock/
COPY test/go.mod test/go.sum test/
RUN cd cmd/pgbaton && go mod download
COPY . .
ARG VERSION=dev
ARG COMMIT=
RUN make build-static OUT=/out/pgbaton VERSION="${VERSION}" COMMIT="${COMMIT}"

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/pgbaton /usr/local/bin/pgbaton
USER nonroot:nonroot
ENTRYPOINT ["/usr/local/bin/pgbaton"]
CMD ["--help"]
