#!/usr/bin/env bash
# The local test control plane: etcd, kube-apiserver and kube-controller-manager
# on 127.0.0.1, with TLS from a CA of our own, RBAC, and service-account tokens.
#
#   cluster.sh up      start it, or reuse a healthy one; prints the KUBECONFIG line
#   cluster.sh down    stop it and remove its state
#   cluster.sh status  exit 0 when a healthy cluster is running (with its registry and node);
#                      lists the registry's repositories
#   cluster.sh restart etcd|kube-apiserver
#                      SIGKILL one component and start it again on the same state
#                      (the fault-injection suite's crash of a control-plane process)
#   cluster.sh kill|start COMPONENT
#                      SIGKILL one component, or start it again on the same state and
#                      wait until it is healthy (HA: etcd-0..2, kube-apiserver-0..1)
#
# Binaries come from BIN_DIR (built by `make controlplane-bins`). State, logs and
# the admin kubeconfig live in STATE_DIR (target/cluster by default), and each API
# server's audit log (STATE_DIR/<component>-audit.log), which holds only what
# tests/controlplane/audit-policy.yaml names: a few test namespaces' writes.
#
# With the single-server plane (not HA), an OCI registry on 127.0.0.1:REGISTRY_PORT
# (`crane registry serve`, blobs in STATE_DIR/registry): make image-local and make chart
# push to it, the node's containerd pulls from it (plain HTTP, loopback only). It keeps
# tags and manifests in memory: after it restarted, push again (make image-local chart).
#
# HA=1: a replicated control plane instead, every link through palisade-linkproxy
# (LINKPROXY, tests/support/bin/linkproxy.rs), on ports from HA_PORT_BASE (B):
#
#   B+0..2    etcd members 0..2, client port      B+10..12  their peer ports
#   B+20..22  etcd-peer-0..2: the peer ports the members advertise (a proxy that
#             knows which member dialled, so one can be partitioned from others)
#   B+30..32  apiserver-0-etcd-0..2: kube-apiserver-0's links to the members
#   B+40..42  apiserver-1-etcd-0..2: kube-apiserver-1's
#   B+50      the link proxy's control port (palisade-linkproxy send B+50 'links')
#   B+60..61  kube-apiserver-0 and -1, each with its own watch cache
#   B+70..71  lb-0, lb-1: load balancers, each preferring its API server and
#             failing over to the other when it is down
#
# The admin kubeconfig goes through lb-0; kubeconfig-lb-1 through lb-1;
# kubeconfig-apiserver-0 and -1 straight to one server each. The controller-manager
# uses lb-0. No node in HA mode: it is for the control-plane suites.
#
# BARE=1: etcd and kube-apiserver only (no controller-manager, registry or node): what
# `make demo` needs, and all it builds. Any running plane serves it; a later `up`
# without BARE replaces a bare plane with the whole one.
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
STATE_DIR=${STATE_DIR:-$root/target/cluster}
BIN_DIR=${BIN_DIR:?BIN_DIR must name the directory with etcd, kube-apiserver and kube-controller-manager}
ETCD_PORT=${ETCD_PORT:-23790}
ETCD_PEER_PORT=${ETCD_PEER_PORT:-23800}
APISERVER_PORT=${APISERVER_PORT:-16443}
KCM_PORT=${KCM_PORT:-16257}
REGISTRY_PORT=${REGISTRY_PORT:-15005}
START_TIMEOUT=${START_TIMEOUT:-90}
# NODE=1: also a node (kube-scheduler, containerd, kubelet; tests/controlplane/node.sh).
NODE=${NODE:-1}
HA=${HA:-0}
BARE=${BARE:-0}
HA_PORT_BASE=${HA_PORT_BASE:-24000}
if [[ $HA == 1 ]]; then
  NODE=0
  APISERVER_PORT=$((HA_PORT_BASE + 70))
fi
[[ $BARE != 1 ]] || NODE=0
KUBERNETES_SERVICE_IP=${KUBERNETES_SERVICE_IP:-10.0.0.1}
export STATE_DIR BIN_DIR APISERVER_PORT START_TIMEOUT KUBERNETES_SERVICE_IP REGISTRY_PORT

if [[ $HA == 1 ]]; then
  components=(linkproxy etcd-0 etcd-1 etcd-2 kube-apiserver-0 kube-apiserver-1 kube-controller-manager)
elif [[ $BARE == 1 ]]; then
  components=(etcd kube-apiserver)
else
  components=(etcd kube-apiserver kube-controller-manager)
fi

log() { echo "cluster: $*" >&2; }

pid_alive() { # component
  local f="$STATE_DIR/$1.pid"
  [[ -f $f ]] && kill -0 "$(cat "$f")" 2>/dev/null
}

apiserver_ready() { # [port]
  [[ -f $STATE_DIR/pki/admin.crt ]] || return 1
  curl -sf --max-time 3 --cacert "$STATE_DIR/pki/ca.crt" \
    --cert "$STATE_DIR/pki/admin.crt" --key "$STATE_DIR/pki/admin.key" \
    "https://127.0.0.1:${1:-$APISERVER_PORT}/readyz" >/dev/null 2>&1
}

healthy() {
  for c in "${components[@]}"; do pid_alive "$c" || return 1; done
  if [[ $HA == 1 ]]; then
    apiserver_ready $((HA_PORT_BASE + 60)) && apiserver_ready $((HA_PORT_BASE + 61))
  else
    apiserver_ready
  fi
}

fail_with_log() { # component message
  log "$2"
  if [[ -f $STATE_DIR/$1.log ]]; then
    log "last lines of $STATE_DIR/$1.log:"
    tail -n 30 "$STATE_DIR/$1.log" >&2
  fi
  exit 1
}

stop_component() { # component
  local c=$1 pid
  [[ -f $STATE_DIR/$c.pid ]] || return 0
  pid=$(cat "$STATE_DIR/$c.pid")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    # Its ports must be free before anyone starts a new cluster.
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  fi
  rm -f "$STATE_DIR/$c.pid"
}

stop_all() {
  local c
  for c in registry kube-controller-manager kube-apiserver kube-apiserver-0 kube-apiserver-1 etcd etcd-0 etcd-1 etcd-2 linkproxy; do
    stop_component "$c"
  done
}

# A client certificate signed by our CA: name, CN, O (group, may be empty).
client_cert() {
  local pki=$STATE_DIR/pki subj="/CN=$2"
  [[ -n $3 ]] && subj="/O=$3/CN=$2"
  openssl req -new -newkey rsa:2048 -nodes -keyout "$pki/$1.key" -out "$pki/$1.csr" -subj "$subj" 2>/dev/null
  openssl x509 -req -in "$pki/$1.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
    -days 365 -out "$pki/$1.crt" -extfile <(printf 'extendedKeyUsage=clientAuth\n') 2>/dev/null
}

make_pki() {
  local pki=$STATE_DIR/pki
  mkdir -p "$pki"
  openssl req -x509 -new -newkey rsa:2048 -nodes -keyout "$pki/ca.key" -out "$pki/ca.crt" \
    -days 365 -subj "/CN=palisade-test-ca" 2>/dev/null
  openssl req -new -newkey rsa:2048 -nodes -keyout "$pki/apiserver.key" -out "$pki/apiserver.csr" \
    -subj "/CN=kube-apiserver" 2>/dev/null
  openssl x509 -req -in "$pki/apiserver.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
    -days 365 -out "$pki/apiserver.crt" -extfile <(printf '%s\n' \
      "subjectAltName=IP:127.0.0.1,IP:$KUBERNETES_SERVICE_IP,DNS:localhost,DNS:kubernetes.default.svc" \
      'extendedKeyUsage=serverAuth') 2>/dev/null
  client_cert admin palisade-admin system:masters
  client_cert kcm system:kube-controller-manager ""
  openssl genrsa -out "$pki/sa.key" 2048 2>/dev/null
  openssl rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
}

# A kubeconfig with embedded credentials: file, cert name[, API server port].
write_kubeconfig() {
  local pki=$STATE_DIR/pki
  cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: palisade-test
  cluster:
    server: https://127.0.0.1:${3:-$APISERVER_PORT}
    certificate-authority-data: $(base64 -w0 "$pki/ca.crt")
users:
- name: $2
  user:
    client-certificate-data: $(base64 -w0 "$pki/$2.crt")
    client-key-data: $(base64 -w0 "$pki/$2.key")
contexts:
- name: palisade-test
  context: {cluster: palisade-test, user: $2}
current-context: palisade-test
EOF
}

start() { # component args...
  start_as "$1" "$BIN_DIR/$1" "${@:2}"
}

start_as() { # component binary args...
  local c=$1 bin=$2
  shift 2
  # 9>&-: the daemons must not inherit (and hold) the lock of this script.
  setsid "$bin" "$@" </dev/null >>"$STATE_DIR/$c.log" 2>&1 9>&- &
  echo $! >"$STATE_DIR/$c.pid"
}

wait_for() { # component description command...
  local c=$1 what=$2 deadline=$((SECONDS + START_TIMEOUT))
  shift 2
  until "$@"; do
    pid_alive "$c" || fail_with_log "$c" "$c exited while waiting for $what"
    ((SECONDS < deadline)) || fail_with_log "$c" "$c: $what not reached within ${START_TIMEOUT}s"
    sleep 0.2
  done
}

etcd_healthy() { # [port]
  curl -sf --max-time 2 "http://127.0.0.1:${1:-$ETCD_PORT}/health" | grep -q '"health":"true"'
}

start_etcd() {
  start etcd --name palisade-test --data-dir "$STATE_DIR/etcd" --unsafe-no-fsync \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster "palisade-test=http://127.0.0.1:$ETCD_PEER_PORT" --listen-metrics-urls "" \
    --log-level warn
}

start_apiserver() { # [component port etcd-servers]
  local pki=$STATE_DIR/pki c=${1:-kube-apiserver} port=${2:-$APISERVER_PORT}
  local etcd_servers=${3:-http://127.0.0.1:$ETCD_PORT}
  # Pods in a namespace without the annotation scheduler.alpha.kubernetes.io/node-selector
  # get this node selector, which no node matches: the Pod objects tests create as records
  # stay unscheduled. Namespaces meant to run pods carry the annotation, empty.
  cat >"$STATE_DIR/admission.yaml" <<EOF
apiVersion: apiserver.config.k8s.io/v1
kind: AdmissionConfiguration
plugins:
- name: PodNodeSelector
  configuration:
    podNodeSelectorPluginConfig:
      clusterDefaultNodeSelector: "palisade.dev/no-node=records-only"
EOF
  start_as "$c" "$BIN_DIR/kube-apiserver" --etcd-servers "$etcd_servers" \
    --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$port" \
    --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" \
    --client-ca-file "$pki/ca.crt" --authorization-mode Node,RBAC \
    --enable-admission-plugins NodeRestriction,PodNodeSelector --admission-control-config-file "$STATE_DIR/admission.yaml" \
    --kubelet-client-certificate "$pki/admin.crt" --kubelet-client-key "$pki/admin.key" \
    --kubelet-preferred-address-types InternalIP \
    --service-cluster-ip-range 10.0.0.0/24 --allow-privileged=true \
    --service-account-issuer "https://127.0.0.1:$APISERVER_PORT" \
    --service-account-key-file "$pki/sa.pub" --service-account-signing-key-file "$pki/sa.key" \
    --api-audiences "https://127.0.0.1:$APISERVER_PORT" \
    --audit-policy-file "$root/tests/controlplane/audit-policy.yaml" --audit-log-path "$STATE_DIR/$c-audit.log" \
    --audit-log-maxsize 100 --audit-log-maxbackup 1 \
    --endpoint-reconciler-type none --v 1
}

registry_answers() {
  curl -sf --max-time 2 -o /dev/null "http://127.0.0.1:$REGISTRY_PORT/v2/"
}

registry_healthy() {
  pid_alive registry && registry_answers
}

# The image registry, reused when healthy. A registry another cluster started on this
# port (the chaos suite's plane runs next to `make cluster`'s) serves both, like any
# shared registry; anything else on the port makes ours exit (its log says so) and `up` fail.
start_registry() {
  if registry_healthy; then
    log "reusing the running registry on 127.0.0.1:$REGISTRY_PORT"
    return 0
  fi
  if ! pid_alive registry && registry_answers; then
    log "using the registry another cluster runs on 127.0.0.1:$REGISTRY_PORT"
    return 0
  fi
  [[ -x $BIN_DIR/crane ]] || { log "missing $BIN_DIR/crane (run make controlplane-bins)"; exit 1; }
  stop_component registry
  mkdir -p "$STATE_DIR/registry"
  start_as registry "$BIN_DIR/crane" registry serve --address "127.0.0.1:$REGISTRY_PORT" --disk "$STATE_DIR/registry"
  wait_for registry "/v2/ on 127.0.0.1:$REGISTRY_PORT" registry_answers
  log "registry on 127.0.0.1:$REGISTRY_PORT, no tags yet (make image-local and make chart push them)"
}

# The HA plane's links: every etcd peer port, every API server's etcd link and the
# load balancers, through one palisade-linkproxy.
start_linkproxy() {
  local b=$HA_PORT_BASE i j links=()
  for i in 0 1 2; do
    links+=(--link "etcd-peer-$i=$((b + 20 + i)):$((b + 10 + i)):etcd-peer")
    for j in 0 1; do
      links+=(--link "apiserver-$j-etcd-$i=$((b + 30 + 10 * j + i)):$((b + i))")
    done
  done
  links+=(--link "lb-0=$((b + 70)):$((b + 60)),$((b + 61))" --link "lb-1=$((b + 71)):$((b + 61)),$((b + 60))")
  start_as linkproxy "$LINKPROXY" serve --control $((b + 50)) "${links[@]}"
}

linkproxy_ready() {
  "$LINKPROXY" send $((HA_PORT_BASE + 50)) links >/dev/null 2>&1
}

start_etcd_member() { # i
  local b=$HA_PORT_BASE i=$1
  start_as "etcd-$i" "$BIN_DIR/etcd" --name "m$i" --data-dir "$STATE_DIR/etcd-$i" --unsafe-no-fsync \
    --listen-client-urls "http://127.0.0.1:$((b + i))" --advertise-client-urls "http://127.0.0.1:$((b + i))" \
    --listen-peer-urls "http://127.0.0.1:$((b + 10 + i))" --initial-advertise-peer-urls "http://127.0.0.1:$((b + 20 + i))" \
    --initial-cluster "m0=http://127.0.0.1:$((b + 20)),m1=http://127.0.0.1:$((b + 21)),m2=http://127.0.0.1:$((b + 22))" \
    --initial-cluster-token palisade-ha --initial-cluster-state new --listen-metrics-urls "" --log-level warn
}

start_ha_apiserver() { # j
  local b=$HA_PORT_BASE j=$1
  start_apiserver "kube-apiserver-$j" $((b + 60 + j)) \
    "http://127.0.0.1:$((b + 30 + 10 * j)),http://127.0.0.1:$((b + 31 + 10 * j)),http://127.0.0.1:$((b + 32 + 10 * j))"
}

# Starts one component of the HA plane on its state and waits until it is healthy.
start_component() { # component
  local b=$HA_PORT_BASE
  case $1 in
    etcd-[012])
      start_etcd_member "${1#etcd-}"
      wait_for "$1" "health" etcd_healthy $((b + ${1#etcd-}))
      ;;
    kube-apiserver-[01])
      start_ha_apiserver "${1#kube-apiserver-}"
      wait_for "$1" "/readyz" apiserver_ready $((b + 60 + ${1#kube-apiserver-}))
      ;;
    *)
      log "cannot start $1 on its own (etcd-0..2, kube-apiserver-0..1)"
      exit 2
      ;;
  esac
}

start_ha_plane() {
  local b=$HA_PORT_BASE i
  [[ -x ${LINKPROXY:-} ]] || { log "LINKPROXY must name the palisade-linkproxy binary (make linkproxy)"; exit 1; }
  start_linkproxy
  wait_for linkproxy "its control port" linkproxy_ready
  # All three at once: a member waits for a quorum before it is healthy.
  for i in 0 1 2; do start_etcd_member $i; done
  for i in 0 1 2; do wait_for "etcd-$i" "health" etcd_healthy $((b + i)); done
  start_ha_apiserver 0
  start_ha_apiserver 1
  wait_for kube-apiserver-0 "/readyz" apiserver_ready $((b + 60))
  wait_for kube-apiserver-1 "/readyz" apiserver_ready $((b + 61))
  write_kubeconfig "$STATE_DIR/kubeconfig-lb-1" admin $((b + 71))
  write_kubeconfig "$STATE_DIR/kubeconfig-apiserver-0" admin $((b + 60))
  write_kubeconfig "$STATE_DIR/kubeconfig-apiserver-1" admin $((b + 61))
}

up() {
  if healthy; then
    log "reusing the running cluster"
  else
    local bins=(etcd kube-apiserver kube-controller-manager)
    [[ $BARE != 1 ]] || bins=(etcd kube-apiserver)
    for c in "${bins[@]}"; do
      [[ -x $BIN_DIR/$c ]] || { log "missing $BIN_DIR/$c (run make controlplane-bins)"; exit 1; }
    done
    "$root/tests/controlplane/node.sh" down
    stop_all
    rm -rf "$STATE_DIR"
    mkdir -p "$STATE_DIR"
    local t0=$SECONDS
    make_pki
    write_kubeconfig "$STATE_DIR/kubeconfig" admin
    write_kubeconfig "$STATE_DIR/kcm.kubeconfig" kcm
    local pki=$STATE_DIR/pki

    if [[ $HA == 1 ]]; then
      start_ha_plane
    else
      start_etcd
      wait_for etcd "health" etcd_healthy
      start_apiserver
      wait_for kube-apiserver "/readyz" apiserver_ready
    fi

    if [[ $BARE == 1 ]]; then
      log "started etcd and kube-apiserver (bare: no controller-manager, registry or node) in $((SECONDS - t0))s"
      echo "export KUBECONFIG=$STATE_DIR/kubeconfig"
      return 0
    fi
    start kube-controller-manager --kubeconfig "$STATE_DIR/kcm.kubeconfig" \
      --authentication-kubeconfig "$STATE_DIR/kcm.kubeconfig" --authorization-kubeconfig "$STATE_DIR/kcm.kubeconfig" \
      --bind-address 127.0.0.1 --secure-port "$KCM_PORT" --leader-elect=false \
      --controllers serviceaccount-controller,serviceaccount-token-controller,namespace-controller,garbage-collector-controller,clusterrole-aggregation-controller,validatingadmissionpolicy-status-controller,root-ca-certificate-publisher-controller,deployment-controller,replicaset-controller,statefulset-controller,pod-garbage-collector-controller,node-lifecycle-controller \
      --use-service-account-credentials --service-account-private-key-file "$pki/sa.key" \
      --root-ca-file "$pki/ca.crt" --v 1
    # The serviceaccount controller creates `default` in every namespace; pods need it.
    wait_for kube-controller-manager "the default ServiceAccount" default_sa_exists
    log "started in $((SECONDS - t0))s"
  fi
  if [[ $HA != 1 && $BARE != 1 ]]; then start_registry; fi
  if [[ $NODE == 1 ]]; then "$root/tests/controlplane/node.sh" up; fi
  echo "export KUBECONFIG=$STATE_DIR/kubeconfig"
}

default_sa_exists() {
  curl -sf --max-time 2 --cacert "$STATE_DIR/pki/ca.crt" \
    --cert "$STATE_DIR/pki/admin.crt" --key "$STATE_DIR/pki/admin.key" \
    "https://127.0.0.1:$APISERVER_PORT/api/v1/namespaces/default/serviceaccounts/default" >/dev/null 2>&1
}

# Exit 0 when the plane, the registry (not HA) and the node (NODE=1) are healthy; says
# what the registry holds, or that it does not answer.
status() {
  healthy || return 1
  if [[ $HA != 1 && $BARE != 1 ]]; then
    registry_answers || { log "no registry answers on 127.0.0.1:$REGISTRY_PORT"; return 1; }
    log "registry on 127.0.0.1:$REGISTRY_PORT: $(curl -sf --max-time 2 "http://127.0.0.1:$REGISTRY_PORT/v2/_catalog")"
  fi
  [[ $NODE != 1 ]] || "$root/tests/controlplane/node.sh" status
}

# SIGKILL, not SIGTERM: a crash, with whatever was in flight lost.
kill_component() { # component
  local c=$1 pid
  pid_alive "$c" || { log "$c is not running"; exit 1; }
  pid=$(cat "$STATE_DIR/$c.pid")
  kill -KILL "$pid"
  for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  rm -f "$STATE_DIR/$c.pid"
}

restart() { # component
  local c=$1
  kill_component "$c"
  case $c in
    etcd) start_etcd && wait_for etcd "health" etcd_healthy ;;
    kube-apiserver) start_apiserver && wait_for kube-apiserver "/readyz" apiserver_ready ;;
  esac
  log "restarted $c"
}

down() {
  "$root/tests/controlplane/node.sh" down
  stop_all
  rm -rf "$STATE_DIR"
  log "stopped"
}

# One caller at a time: parallel test binaries and make may race to start it.
mkdir -p "$(dirname "$STATE_DIR")"
exec 9>"$STATE_DIR.lock"
flock 9

case ${1:-} in
  up) up ;;
  down) down ;;
  status) status ;;
  kill | start)
    case ${2:-} in
      etcd-[012] | kube-apiserver-[01]) [[ $HA == 1 ]] || { log "$2: only with HA=1"; exit 2; } ;;
      *)
        echo "usage: $0 kill|start etcd-0|etcd-1|etcd-2|kube-apiserver-0|kube-apiserver-1 (HA=1)" >&2
        exit 2
        ;;
    esac
    if [[ $1 == kill ]]; then
      kill_component "$2" && log "killed $2"
    else
      pid_alive "$2" && { log "$2 is running"; exit 1; }
      start_component "$2" && log "started $2"
    fi
    ;;
  restart)
    case ${2:-} in
      etcd | kube-apiserver) restart "$2" ;;
      etcd-[012] | kube-apiserver-[01]) kill_component "$2" && start_component "$2" && log "restarted $2" ;;
      *)
        echo "usage: $0 restart etcd|kube-apiserver" >&2
        exit 2
        ;;
    esac
    ;;
  *)
    echo "usage: $0 up|down|status|restart etcd|kube-apiserver|kill COMPONENT|start COMPONENT" >&2
    exit 2
    ;;
esac
