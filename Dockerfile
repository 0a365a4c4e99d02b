# One image for every allot binary: coordinator, agent, gateway and sim.
# Static (CGO_ENABLED=0) binaries on an empty base, run as a non-root user;
# the container's command picks the binary:
#
#   docker build -t allot .
#   docker run --rm allot coordinator serve -h
#   docker run --rm allot agent -h
#
# deploy/dockerfile_test.go reads this file: it checks the stages, the
# user, every COPY, and runs the build stage's commands to show that the
# binaries build and link statically.

ARG GO_VERSION=1.26.8

FROM golang:${GO_VERSION}-bookworm AS build
WORKDIR /src
# Modules first, so a source change does not download them again.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o /out/ ./cmd/coordinator ./cmd/agent ./cmd/gateway ./cmd/sim
# The one user of the final image (no shell, no home).
RUN echo 'allot:x:65532:65532:allot:/nonexistent:/sbin/nologin' > /out/passwd && echo 'allot:x:65532:' > /out/group

FROM scratch
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=build /out/passwd /etc/passwd
COPY --from=build /out/group /etc/group
COPY --from=build /out/coordinator /out/agent /out/gateway /out/sim /usr/local/bin/
ENV PATH=/usr/local/bin
USER 65532:65532
# coordinator: gRPC 7070, HTTP 7071; agent: HTTP 8080, gRPC 8081, memberlist 7946.
EXPOSE 7070 7071 8080 8081 7946
