#!/usr/bin/env bash
# A throwaway 3-primary Redis Cluster on loopback, for the idemgate-redis tests.
#   scripts/redis-cluster.sh start   # prints the node URLs, comma-separated
#   scripts/redis-cluster.sh stop    # kills the nodes by PID, removes the state
# State (pids, ports, node configs, the URL list) lives in target/redis-cluster/.
# `start` on a cluster that is already up and healthy prints its URLs again.
set -euo pipefail
cd "$(dirname "$0")/.."

STATE="$PWD/target/redis-cluster"
NODES=3

log() { printf '[redis-cluster] %s\n' "$*" >&2; }
die() { printf '[redis-cluster] ERROR: %s\n' "$*" >&2; exit 1; }

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# A port p with p and its cluster-bus port p+10000 both free.
free_port() {
  local port
  for _ in $(seq 1 200); do
    port=$((20000 + RANDOM % 10000))
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
  local port addrs=()
  for _ in $(seq 1 "$NODES"); do
    port=$(free_port)
    echo "$port" >>"$STATE/ports"
    mkdir -p "$STATE/$port"
    redis-server --port "$port" --bind 127.0.0.1 \
      --cluster-enabled yes --cluster-config-file "$STATE/$port/nodes.conf" \
      --cluster-node-timeout 5000 --save "" --appendonly no \
      --dir "$STATE/$port" --daemonize yes --pidfile "$STATE/$port.pid" \
      --logfile "$STATE/$port/redis.log" >/dev/null \
      || die "redis-server could not start on port $port"
    addrs+=("127.0.0.1:$port")
  done
  for port in $(cat "$STATE/ports"); do
    for _ in $(seq 1 40); do
      cli "$port" ping 2>/dev/null | grep -q PONG && break
      sleep 0.25
    done
    cli "$port" ping 2>/dev/null | grep -q PONG || die "node on port $port did not answer PING"
  done
  redis-cli --cluster create "${addrs[@]}" --cluster-replicas 0 --cluster-yes >"$STATE/create.log" 2>&1 \
    || { cat "$STATE/create.log" >&2; die "redis-cli --cluster create failed"; }
  for _ in $(seq 1 80); do
    healthy && break
    sleep 0.25
  done
  healthy || die "cluster_state did not become ok within 20 s"
  local urls
  urls=$(sed 's|^|redis://127.0.0.1:|' "$STATE/ports" | paste -sd, -)
  echo "$urls" >"$STATE/urls"
  log "up: $urls"
  echo "$urls"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  *) die "usage: $0 start|stop" ;;
esac
