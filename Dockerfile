# syntax=docker/dockerfile:1
# The idemgate image: `idemgate proxy` by default, `idemgate serve` (the orders
# demo) or `idemgate keys` on request. docs/deploy.md says how to run it.
#
#   docker build --build-arg IDEMGATE_BUILD_COMMIT=$(git rev-parse HEAD) -t idemgate:0.1.0 .
#
# The build stage runs scripts/dist.sh, the one command that builds the shipped
# binary (the `dist` profile of Cargo.toml, the committed lock file); the runtime
# stage is the same Debian release, so the binary finds the glibc it was linked
# against.

ARG DEBIAN_RELEASE=bookworm

FROM rust:1.95-slim-${DEBIAN_RELEASE} AS build
WORKDIR /src
COPY . .
# .dockerignore leaves .git out of the context: build.rs takes the commit from here.
ARG IDEMGATE_BUILD_COMMIT=unknown
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    scripts/dist.sh /out

FROM debian:${DEBIAN_RELEASE}-slim
# curl is the HEALTHCHECK's probe (the binary has no HTTP client subcommand);
# the user owns only the data directory. Debian's security updates move the
# package's version: pinning it would break the build, not make it repeatable.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends curl \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 idemgate \
    && useradd --system --uid 10001 --gid idemgate --home-dir /var/lib/idemgate --no-create-home --shell /usr/sbin/nologin idemgate \
    && mkdir -p /etc/idemgate /var/lib/idemgate \
    && chown idemgate:idemgate /var/lib/idemgate
COPY --from=build /out/idemgate /usr/local/bin/idemgate
USER 10001:10001
# The SQLite defaults (`serve`: sqlite://./idemgate.db, `proxy`:
# sqlite://./idemgate-proxy.db) are relative: they land in the data volume.
WORKDIR /var/lib/idemgate
# Both listeners on every address of the container; the admin one (health,
# metrics, the key API) should still not be published to the public network.
ENV IDEMGATE_LISTEN=0.0.0.0:8080 \
    IDEMGATE_ADMIN_LISTEN=0.0.0.0:9901 \
    IDEMGATE_LOG_FORMAT=json
EXPOSE 8080 9901
# /etc/idemgate: the route file (IDEMGATE_CONFIG=/etc/idemgate/routes.toml) and
# secret files, mounted read-only; /var/lib/idemgate: SQLite data.
VOLUME ["/etc/idemgate", "/var/lib/idemgate"]
# The probe follows the admin port of IDEMGATE_ADMIN_LISTEN (its shell expands it).
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
    CMD ["/bin/sh", "-c", "curl -fsS -o /dev/null \"http://127.0.0.1:${IDEMGATE_ADMIN_LISTEN##*:}/healthz\" || exit 1"]
# SIGTERM drains in-flight requests for IDEMGATE_SHUTDOWN_TIMEOUT_SECONDS (30):
# give `docker stop` more than that (`--time 40`, compose's stop_grace_period).
STOPSIGNAL SIGTERM
ENTRYPOINT ["idemgate"]
CMD ["proxy"]
