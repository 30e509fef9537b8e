#!/usr/bin/env bash
# A throwaway 3-primary Redis Cluster on loopback, for the idemgate-redis tests.
#   scripts/redis-cluster.sh start   # prints the node URLs, comma-separated
#   scripts/redis-cluster.sh stop    # kills the nodes by PID, removes the state
#   scripts/redis-cluster.sh start --replicas 1   # 3 primaries + 1 replica each
#   scripts/redis-cluster.sh stop --replicas 1
#   scripts/redis-cluster.sh restart-node PORT --replicas 1   # a killed node again
# State (pids, ports, node configs, the URL list) lives in target/redis-cluster/
# (target/redis-cluster-replicas/ with --replicas), or in $REDIS_CLUSTER_STATE when
# set, so a test can run a cluster of its own next to the shared one. Each node's PID
# is in <state>/<port>.pid; `stop` kills every one of them.
# With --replicas the cluster fails over quickly (cluster-node-timeout 1000 ms, or
# $REDIS_CLUSTER_NODE_TIMEOUT), and `start` returns once every replica is in sync; the
# URLs printed are those of all nodes, primaries first.
# `start` on a cluster that is already up and healthy prints its URLs again.
set -euo pipefail
cd "$(dirname "$0")/.."

PRIMARIES=3
REPLICAS=0
COMMAND="${1:-}"
shift || true
NODE_PORT=""
if [ "$COMMAND" = restart-node ]; then
  NODE_PORT="${1:-}"
  shift || true
fi
while [ $# -gt 0 ]; do
  case "$1" in
    --replicas) REPLICAS="${2:?--replicas needs a number}"; shift 2 ;;
    *) printf '[redis-cluster] ERROR: unknown option %s\n' "$1" >&2; exit 1 ;;
  esac
done
case "$REPLICAS" in ''|*[!0-9]*) printf '[redis-cluster] ERROR: --replicas %s is not a number\n' "$REPLICAS" >&2; exit 1 ;; esac
if [ "$REPLICAS" -eq 0 ]; then
  STATE="${REDIS_CLUSTER_STATE:-$PWD/target/redis-cluster}"
  NODE_TIMEOUT="${REDIS_CLUSTER_NODE_TIMEOUT:-5000}"
else
  STATE="${REDIS_CLUSTER_STATE:-$PWD/target/redis-cluster-replicas}"
  NODE_TIMEOUT="${REDIS_CLUSTER_NODE_TIMEOUT:-1000}"
fi
NODES=$((PRIMARIES * (REPLICAS + 1)))

log() { printf '[redis-cluster] %s\n' "$*" >&2; }
die() { printf '[redis-cluster] ERROR: %s\n' "$*" >&2; exit 1; }

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# A port p with p and its cluster-bus port p+10000 both free. Both stay below 32768,
# where Linux starts handing out ephemeral ports for outgoing connections (which
# could otherwise take a bus port between this check and the node's bind).
free_port() {
  local port
  for _ in $(seq 1 200); do
    port=$((20000 + RANDOM % 2768))
    if ! port_in_use "$port" && ! port_in_use $((port + 10000)) \
      && ! grep -qx "$port" "$STATE/ports" 2>/dev/null; then
      echo "$port"
      return 0
    fi
  done
  die "no free port pair found"
}

cli() { redis-cli -h 127.0.0.1 -p "$1" "${@:2}"; }

healthy() {
  [ -s "$STATE/ports" ] || return 1
  local port
  while read -r port; do
    cli "$port" cluster info 2>/dev/null | grep -q '^cluster_state:ok' || return 1
  done <"$STATE/ports"
}

# Every node sees the intended number of replicas: each replica's link is up.
in_sync() {
  local port replicas=0
  while read -r port; do
    if cli "$port" info replication 2>/dev/null | grep -q '^role:slave'; then
      cli "$port" info replication 2>/dev/null | grep -q '^master_link_status:up' || return 1
      replicas=$((replicas + 1))
    fi
  done <"$STATE/ports"
  [ "$replicas" -eq $((PRIMARIES * REPLICAS)) ]
}

# Starts (or starts again) the node on port $1, daemonized, its PID in $STATE/$1.pid.
start_node() {
  redis-server --port "$1" --bind 127.0.0.1 \
    --cluster-enabled yes --cluster-config-file "$STATE/$1/nodes.conf" \
    --cluster-node-timeout "$(cat "$STATE/node-timeout")" --save "" --appendonly no \
    --dir "$STATE/$1" --daemonize yes --pidfile "$STATE/$1.pid" \
    --logfile "$STATE/$1/redis.log" >/dev/null \
    || die "redis-server could not start on port $1"
}

# Whether process $1 exists and is not a zombie (a killed daemon whose parent has not
# reaped it yet still answers kill -0).
alive() {
  kill -0 "$1" 2>/dev/null || return 1
  local state
  state=$(ps -o stat= -p "$1" 2>/dev/null) || return 1
  [ "${state#Z}" = "$state" ]
}

# Starts a node of the cluster again after it was killed (it rejoins, as a replica of
# whoever took over its slots); waits until it answers PING.
restart_node() {
  local port="${1:?restart-node needs a port}"
  grep -qx "$port" "$STATE/ports" 2>/dev/null || die "port $port is not a node of the cluster in $STATE"
  if [ -s "$STATE/$port.pid" ] && alive "$(cat "$STATE/$port.pid")"; then
    die "the node on port $port is still running"
  fi
  start_node "$port"
  for _ in $(seq 1 40); do
    cli "$port" ping 2>/dev/null | grep -q PONG && return 0
    sleep 0.25
  done
  die "node on port $port did not answer PING"
}

stop() {
  if [ -d "$STATE" ]; then
    local pidfile pid
    for pidfile in "$STATE"/*.pid; do
      [ -e "$pidfile" ] || continue
      pid=$(cat "$pidfile")
      if kill -0 "$pid" 2>/dev/null; then
        kill -9 "$pid" 2>/dev/null || true
      fi
    done
    rm -rf "$STATE"
    log "stopped"
  fi
}

start() {
  command -v redis-server >/dev/null || die "redis-server missing (scripts/services.sh redis installs it)"
  command -v redis-cli >/dev/null || die "redis-cli missing"
  if healthy; then
    cat "$STATE/urls"
    return 0
  fi
  stop
  mkdir -p "$STATE"
  : >"$STATE/ports"
  echo "$NODE_TIMEOUT" >"$STATE/node-timeout"
  local port addrs=()
  for _ in $(seq 1 "$NODES"); do
    port=$(free_port)
    echo "$port" >>"$STATE/ports"
    mkdir -p "$STATE/$port"
    start_node "$port"
    addrs+=("127.0.0.1:$port")
  done
  for port in $(cat "$STATE/ports"); do
    for _ in $(seq 1 40); do
      cli "$port" ping 2>/dev/null | grep -q PONG && break
      sleep 0.25
    done
    cli "$port" ping 2>/dev/null | grep -q PONG \
      || { tail -5 "$STATE/$port/redis.log" >&2 2>/dev/null; die "node on port $port did not answer PING"; }
  done
  redis-cli --cluster create "${addrs[@]}" --cluster-replicas "$REPLICAS" --cluster-yes >"$STATE/create.log" 2>&1 \
    || { cat "$STATE/create.log" >&2; die "redis-cli --cluster create failed"; }
  for _ in $(seq 1 80); do
    healthy && break
    sleep 0.25
  done
  healthy || die "cluster_state did not become ok within 20 s"
  if [ "$REPLICAS" -gt 0 ]; then
    for _ in $(seq 1 80); do
      in_sync && break
      sleep 0.25
    done
    in_sync || die "replicas did not get in sync within 20 s"
  fi
  local urls
  # Primaries first (redis-cli --cluster create makes the first PRIMARIES of them).
  urls=$(sed 's|^|redis://127.0.0.1:|' "$STATE/ports" | paste -sd, -)
  echo "$urls" >"$STATE/urls"
  log "up: $urls"
  echo "$urls"
}

case "$COMMAND" in
  start) start ;;
  stop) stop ;;
  restart-node) restart_node "$NODE_PORT" ;;
  *) die "usage: $0 start|stop [--replicas N] | restart-node PORT [--replicas N]" ;;
esac
