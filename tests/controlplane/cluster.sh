#!/usr/bin/env bash
# The local test control plane: etcd, kube-apiserver and kube-controller-manager
# on 127.0.0.1, with TLS from a CA of our own, RBAC, and service-account tokens.
#
#   cluster.sh up      start it, or reuse a healthy one; prints the KUBECONFIG line
#   cluster.sh down    stop it and remove its state
#   cluster.sh status  exit 0 when a healthy cluster is running
#   cluster.sh restart etcd|kube-apiserver
#                      SIGKILL one component and start it again on the same state
#                      (the fault-injection suite's crash of a control-plane process)
#
# Binaries come from BIN_DIR (built by `make controlplane-bins`). State, logs and
# the admin kubeconfig live in STATE_DIR (target/cluster by default).
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
STATE_DIR=${STATE_DIR:-$root/target/cluster}
BIN_DIR=${BIN_DIR:?BIN_DIR must name the directory with etcd, kube-apiserver and kube-controller-manager}
ETCD_PORT=${ETCD_PORT:-23790}
ETCD_PEER_PORT=${ETCD_PEER_PORT:-23800}
APISERVER_PORT=${APISERVER_PORT:-16443}
KCM_PORT=${KCM_PORT:-16257}
START_TIMEOUT=${START_TIMEOUT:-90}
# NODE=1: also a node (kube-scheduler, containerd, kubelet; tests/controlplane/node.sh).
NODE=${NODE:-1}
KUBERNETES_SERVICE_IP=${KUBERNETES_SERVICE_IP:-10.0.0.1}
export STATE_DIR BIN_DIR APISERVER_PORT START_TIMEOUT KUBERNETES_SERVICE_IP

components=(etcd kube-apiserver kube-controller-manager)

log() { echo "cluster: $*" >&2; }

pid_alive() { # component
  local f="$STATE_DIR/$1.pid"
  [[ -f $f ]] && kill -0 "$(cat "$f")" 2>/dev/null
}

apiserver_ready() {
  [[ -f $STATE_DIR/pki/admin.crt ]] || return 1
  curl -sf --max-time 3 --cacert "$STATE_DIR/pki/ca.crt" \
    --cert "$STATE_DIR/pki/admin.crt" --key "$STATE_DIR/pki/admin.key" \
    "https://127.0.0.1:$APISERVER_PORT/readyz" >/dev/null 2>&1
}

healthy() {
  for c in "${components[@]}"; do pid_alive "$c" || return 1; done
  apiserver_ready
}

fail_with_log() { # component message
  log "$2"
  if [[ -f $STATE_DIR/$1.log ]]; then
    log "last lines of $STATE_DIR/$1.log:"
    tail -n 30 "$STATE_DIR/$1.log" >&2
  fi
  exit 1
}

stop_all() {
  local c pid
  for c in kube-controller-manager kube-apiserver etcd; do
    [[ -f $STATE_DIR/$c.pid ]] || continue
    pid=$(cat "$STATE_DIR/$c.pid")
    if kill -0 "$pid" 2>/dev/null; then
      kill -TERM "$pid" 2>/dev/null || true
      for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -KILL "$pid" 2>/dev/null || true
      # Its ports must be free before anyone starts a new cluster.
      for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    fi
    rm -f "$STATE_DIR/$c.pid"
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

# A kubeconfig with embedded credentials: file, cert name.
write_kubeconfig() {
  local pki=$STATE_DIR/pki
  cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: palisade-test
  cluster:
    server: https://127.0.0.1:$APISERVER_PORT
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
  local c=$1
  shift
  # 9>&-: the daemons must not inherit (and hold) the lock of this script.
  setsid "$BIN_DIR/$c" "$@" </dev/null >"$STATE_DIR/$c.log" 2>&1 9>&- &
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

etcd_healthy() {
  curl -sf --max-time 2 "http://127.0.0.1:$ETCD_PORT/health" | grep -q '"health":"true"'
}

start_etcd() {
  start etcd --name palisade-test --data-dir "$STATE_DIR/etcd" --unsafe-no-fsync \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster "palisade-test=http://127.0.0.1:$ETCD_PEER_PORT" --listen-metrics-urls "" \
    --log-level warn
}

start_apiserver() {
  local pki=$STATE_DIR/pki
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
  start kube-apiserver --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
    --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$APISERVER_PORT" \
    --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" \
    --client-ca-file "$pki/ca.crt" --authorization-mode Node,RBAC \
    --enable-admission-plugins NodeRestriction,PodNodeSelector --admission-control-config-file "$STATE_DIR/admission.yaml" \
    --kubelet-client-certificate "$pki/admin.crt" --kubelet-client-key "$pki/admin.key" \
    --kubelet-preferred-address-types InternalIP \
    --service-cluster-ip-range 10.0.0.0/24 --allow-privileged=true \
    --service-account-issuer "https://127.0.0.1:$APISERVER_PORT" \
    --service-account-key-file "$pki/sa.pub" --service-account-signing-key-file "$pki/sa.key" \
    --api-audiences "https://127.0.0.1:$APISERVER_PORT" \
    --endpoint-reconciler-type none --v 1
}

up() {
  if healthy; then
    log "reusing the running cluster"
  else
    for c in "${components[@]}"; do
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

    start_etcd
    wait_for etcd "health" etcd_healthy

    start_apiserver
    wait_for kube-apiserver "/readyz" apiserver_ready

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
  if [[ $NODE == 1 ]]; then "$root/tests/controlplane/node.sh" up; fi
  echo "export KUBECONFIG=$STATE_DIR/kubeconfig"
}

default_sa_exists() {
  curl -sf --max-time 2 --cacert "$STATE_DIR/pki/ca.crt" \
    --cert "$STATE_DIR/pki/admin.crt" --key "$STATE_DIR/pki/admin.key" \
    "https://127.0.0.1:$APISERVER_PORT/api/v1/namespaces/default/serviceaccounts/default" >/dev/null 2>&1
}

# SIGKILL, not SIGTERM: a crash, with whatever was in flight lost.
restart() { # component
  local c=$1 pid
  pid_alive "$c" || { log "$c is not running"; exit 1; }
  pid=$(cat "$STATE_DIR/$c.pid")
  kill -KILL "$pid"
  for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
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
  status) healthy && { [[ $NODE != 1 ]] || "$root/tests/controlplane/node.sh" status; } ;;
  restart)
    case ${2:-} in
      etcd | kube-apiserver) restart "$2" ;;
      *)
        echo "usage: $0 restart etcd|kube-apiserver" >&2
        exit 2
        ;;
    esac
    ;;
  *)
    echo "usage: $0 up|down|status|restart etcd|kube-apiserver" >&2
    exit 2
    ;;
esac
