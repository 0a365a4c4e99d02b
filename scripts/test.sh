#!/usr/bin/env bash
# scripts/test.sh — the project's test command (`make test`).
#
# On a fresh machine it installs what the tests need (redis-server,
# redis-sentinel, etcd; for the deploy tests Prometheus, systemd-analyze
# and openssl), starts a throwaway redis-server and etcd on free loopback
# ports with no persistence, runs `go test -race ./...` against them, then
# the deploy module's tests (deploy/, a module of its own: the image, the
# manifests, the units, the dashboard and alerts), and stops the servers on
# exit, also on failure. With BENCH_ONLY=1 it runs the benchmarks instead.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
command -v redis-sentinel >/dev/null 2>&1 || need+=(redis-sentinel)
command -v etcd >/dev/null 2>&1 || need+=(etcd-server)
command -v prometheus >/dev/null 2>&1 || need+=(prometheus)
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
command -v systemd-analyze >/dev/null 2>&1 || need+=(systemd)
command -v openssl >/dev/null 2>&1 || need+=(openssl)
if [ ${#need[@]} -gt 0 ]; then
  echo "test.sh: installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # --no-install-recommends: prometheus's recommended exporters are not needed.
  apt-get install -y -qq --no-install-recommends $(printf '%s\n' "${need[@]}" | sort -u) >/dev/null
fi

work=$(mktemp -d /tmp/allot-test.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT INT TERM

free_port() { # a port nothing listens on, from a range the kernel does not hand out
  local p
  for _ in $(seq 1 50); do
    p=$((20000 + RANDOM % 10000))
    if ! (exec 3<>/dev/tcp/127.0.0.1/$p) 2>/dev/null; then echo "$p"; return; fi
  done
  echo "test.sh: no free port" >&2; exit 1
}

wait_for() { # wait_for <what> <cmd…>: up to 10 s
  local what=$1; shift
  for _ in $(seq 1 100); do "$@" >/dev/null 2>&1 && return 0; sleep 0.1; done
  echo "test.sh: $what did not come up" >&2; return 1
}

rport=$(free_port)
redis-server --port "$rport" --bind 127.0.0.1 --save '' --appendonly no \
  --maxmemory-policy noeviction --dir "$work" --logfile "$work/redis.log" &
pids+=($!)
wait_for "redis-server on $rport" redis-cli -p "$rport" ping
export ALLOT_REDIS_ADDR="127.0.0.1:$rport"

cport=$(free_port); pport=$(free_port)
etcd --name allot-test --data-dir "$work/etcd" \
  --listen-client-urls "http://127.0.0.1:$cport" --advertise-client-urls "http://127.0.0.1:$cport" \
  --listen-peer-urls "http://127.0.0.1:$pport" --initial-advertise-peer-urls "http://127.0.0.1:$pport" \
  --initial-cluster "allot-test=http://127.0.0.1:$pport" --log-level error >"$work/etcd.log" 2>&1 &
pids+=($!)
wait_for "etcd on $cport" bash -c "exec 3<>/dev/tcp/127.0.0.1/$cport"
export ALLOT_ETCD_ENDPOINTS="127.0.0.1:$cport"

echo "test.sh: redis $ALLOT_REDIS_ADDR, etcd $ALLOT_ETCD_ENDPOINTS"
if [ "${BENCH_ONLY:-}" = 1 ]; then
  go test -run '^$' -bench "${BENCH:-.}" -benchmem ${BENCHFLAGS:-} ./...
else
  go test -race -timeout 20m ${TESTFLAGS:-} ${TEST_PKGS:-./...}
  if [ -z "${TEST_PKGS:-}" ]; then
    (cd deploy && go test -timeout 15m ${TESTFLAGS:-} ./...)
  fi
fi
