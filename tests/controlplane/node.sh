#!/usr/bin/env bash
# The local cluster's one node: kube-scheduler, containerd + runc, and a kubelet, next to
# the control plane cluster.sh starts. Called by cluster.sh (NODE=1, the default); see
# docs/testing-node.md for why it is built this way.
#
#   node.sh up     start the node (the control plane must be up); waits for the node Ready
#   node.sh down   delete every pod, stop kubelet, containers, shims, containerd, scheduler;
#                  unmount what they mounted, remove the bridge and pod cgroups
#   node.sh status exit 0 when the node is Ready
#
# Images: the kubelet pulls every workload image from the cluster's registry
# (127.0.0.1:REGISTRY_PORT, cluster.sh; plain HTTP through containerd's hosts.toml). Only
# the sandbox (pause) image is imported, from PAUSE_ARCHIVE, as node infrastructure.
#
# Network: pods get their own network namespace on the bridge palisade0 (POD_CIDR, no
# uplink, no NAT, no default route in the pods): they can reach only this machine. The
# bridge's address is the node IP (the kubelet serves there); the `kubernetes` Service's
# ClusterIP is added to the bridge too, and socat forwards it to the API server on
# 127.0.0.1, so in-cluster clients use the standard KUBERNETES_SERVICE_HOST/PORT.
set -euo pipefail

STATE_DIR=${STATE_DIR:?}
BIN_DIR=${BIN_DIR:?}
APISERVER_PORT=${APISERVER_PORT:-16443}
SCHEDULER_PORT=${SCHEDULER_PORT:-10259}
KUBELET_PORT=${KUBELET_PORT:-10250}
KUBELET_HEALTHZ_PORT=${KUBELET_HEALTHZ_PORT:-10248}
NODE_NAME=${NODE_NAME:-palisade-node}
POD_CIDR=${POD_CIDR:-10.244.0.0/24}
NODE_IP=${NODE_IP:-10.244.0.1}
KUBERNETES_SERVICE_IP=${KUBERNETES_SERVICE_IP:-10.0.0.1}
BRIDGE=${BRIDGE:-palisade0}
# A fixed, locally administered address: a bridge without one takes the lowest address
# among its ports and changes it when that pod's port goes away, and the other pods keep
# the old gateway address cached (their API calls and the kubelet's probes fail for ~30 s).
BRIDGE_MAC=${BRIDGE_MAC:-02:70:61:6c:00:01}
PAUSE_IMAGE=${PAUSE_IMAGE:-palisade.local/pause:1}
PAUSE_ARCHIVE=${PAUSE_ARCHIVE:-$STATE_DIR/../images/pause.tar}
REGISTRY_PORT=${REGISTRY_PORT:-15005}
START_TIMEOUT=${START_TIMEOUT:-90}

N=$STATE_DIR/node
# One node per machine (the bridge, the kubelet's ports and the pod cgroups are
# machine-wide): this file names the cluster state directory that owns it.
OWNER=/run/palisade-node.owner
CTRD_SOCK=$N/containerd/containerd.sock
CNI_BIN_DIR=/usr/lib/cni

log() { echo "node: $*" >&2; }

pid_alive() { [[ -f $STATE_DIR/$1.pid ]] && kill -0 "$(cat "$STATE_DIR/$1.pid")" 2>/dev/null; }

fail_with_log() { # component message
  log "$2"
  [[ -f $STATE_DIR/$1.log ]] && { log "last lines of $STATE_DIR/$1.log:"; tail -n 30 "$STATE_DIR/$1.log" >&2; }
  exit 1
}

start() { # component binary args...
  local c=$1 bin=$2
  shift 2
  setsid "$bin" "$@" </dev/null >"$STATE_DIR/$c.log" 2>&1 9>&- &
  echo $! >"$STATE_DIR/$c.pid"
}

wait_for() { # component description command...
  local c=$1 what=$2 deadline=$((SECONDS + START_TIMEOUT))
  shift 2
  until "$@" >/dev/null 2>&1; do
    pid_alive "$c" || fail_with_log "$c" "$c exited while waiting for $what"
    ((SECONDS < deadline)) || fail_with_log "$c" "$c: $what not reached within ${START_TIMEOUT}s"
    sleep 0.3
  done
}

# Each component was started with setsid: its PID is its process group, which also holds
# what it forked (socat's per-connection children). Shims make sessions of their own.
stop_pid() { # component
  local f=$STATE_DIR/$1.pid pid
  [[ -f $f ]] || return 0
  pid=$(cat "$f")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  fi
  kill -KILL -- "-$pid" 2>/dev/null || true
  rm -f "$f"
}

kubectl() { "$BIN_DIR/kubectl" --kubeconfig "$STATE_DIR/kubeconfig" "$@"; }
ctr() { command ctr --address "$CTRD_SOCK" "$@"; }

# --- pieces --------------------------------------------------------------------------

node_cert() {
  local pki=$STATE_DIR/pki
  [[ -f $pki/node.crt ]] && return 0
  openssl req -new -newkey rsa:2048 -nodes -keyout "$pki/node.key" -out "$pki/node.csr" \
    -subj "/O=system:nodes/CN=system:node:$NODE_NAME" 2>/dev/null
  openssl x509 -req -in "$pki/node.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
    -days 365 -out "$pki/node.crt" -extfile <(printf 'extendedKeyUsage=clientAuth\n') 2>/dev/null
  openssl req -new -newkey rsa:2048 -nodes -keyout "$pki/scheduler.key" -out "$pki/scheduler.csr" \
    -subj "/CN=system:kube-scheduler" 2>/dev/null
  openssl x509 -req -in "$pki/scheduler.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
    -days 365 -out "$pki/scheduler.crt" -extfile <(printf 'extendedKeyUsage=clientAuth\n') 2>/dev/null
}

kubeconfig_for() { # file cert
  local pki=$STATE_DIR/pki
  cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: palisade-test
  cluster:
    server: https://127.0.0.1:$APISERVER_PORT
    certificate-authority: $pki/ca.crt
users:
- name: $2
  user: {client-certificate: $pki/$2.crt, client-key: $pki/$2.key}
contexts:
- name: palisade-test
  context: {cluster: palisade-test, user: $2}
current-context: palisade-test
EOF
}

# The bridge exists before the kubelet starts: its address is the node IP.
network_up() {
  if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
    ip link add "$BRIDGE" address "$BRIDGE_MAC" type bridge
  fi
  ip link set "$BRIDGE" address "$BRIDGE_MAC"
  ip addr replace "$NODE_IP/${POD_CIDR#*/}" dev "$BRIDGE"
  ip addr replace "$KUBERNETES_SERVICE_IP/32" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  mkdir -p "$N/cni/net.d" "$N/cni/ipam"
  # No default route and no masquerading: a pod reaches its subnet (the bridge, i.e. this
  # machine) and the kubernetes Service address, nothing else.
  cat >"$N/cni/net.d/10-palisade.conflist" <<EOF
{"cniVersion": "0.4.0", "name": "palisade", "plugins": [
  {"type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "isDefaultGateway": false,
   "ipMasq": false, "hairpinMode": true,
   "ipam": {"type": "host-local", "dataDir": "$N/cni/ipam",
            "ranges": [[{"subnet": "$POD_CIDR", "gateway": "$NODE_IP"}]],
            "routes": [{"dst": "$KUBERNETES_SERVICE_IP/32"}]}}
]}
EOF
}

start_containerd() {
  local registry=127.0.0.1:$REGISTRY_PORT
  mkdir -p "$N/containerd/certs.d/$registry"
  # The registry speaks plain HTTP (loopback only): without this, containerd tries HTTPS.
  cat >"$N/containerd/certs.d/$registry/hosts.toml" <<EOF
server = "http://$registry"
[host."http://$registry"]
  capabilities = ["pull", "resolve"]
EOF
  cat >"$N/containerd/config.toml" <<EOF
version = 2
root = "$N/containerd/root"
state = "$N/containerd/state"
[grpc]
  address = "$CTRD_SOCK"
[ttrpc]
  address = "$N/containerd/containerd.sock.ttrpc"
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "$N/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  # This machine denies CAP_SYS_RESOURCE: runc must not try to lower oom_score_adj.
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$CNI_BIN_DIR"
    conf_dir = "$N/cni/net.d"
    max_conf_num = 1
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "$N/containerd/certs.d"
EOF
  start containerd "$(command -v containerd)" --config "$N/containerd/config.toml" --log-level warn
  wait_for containerd "its socket" ctr version
}

# The sandbox image, imported on every start: no registry has it, and containerd 1.6
# does not pin it against GC.
import_pause_image() {
  [[ -f $PAUSE_ARCHIVE ]] || { log "missing $PAUSE_ARCHIVE (make node-deps builds it)"; exit 1; }
  ctr -n k8s.io images import "$PAUSE_ARCHIVE" >/dev/null || { log "importing $PAUSE_ARCHIVE failed"; exit 1; }
  # grep reads to the end (no -q): an early exit would SIGPIPE ctr and, under pipefail,
  # fail the check although the image is there.
  ctr -n k8s.io images ls -q | grep -x "$PAUSE_IMAGE" >/dev/null ||
    { log "the sandbox image $PAUSE_IMAGE is not in $PAUSE_ARCHIVE"; exit 1; }
}

start_scheduler() {
  kubeconfig_for "$STATE_DIR/scheduler.kubeconfig" scheduler
  start kube-scheduler "$BIN_DIR/kube-scheduler" --kubeconfig "$STATE_DIR/scheduler.kubeconfig" \
    --authentication-kubeconfig "$STATE_DIR/scheduler.kubeconfig" \
    --authorization-kubeconfig "$STATE_DIR/scheduler.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port "$SCHEDULER_PORT" --leader-elect=false --v 1
}

start_kubelet() {
  mkdir -p "$N/kubelet" "$N/pod-logs"
  kubeconfig_for "$STATE_DIR/kubelet.kubeconfig" node
  cat >"$N/kubelet-config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_IP
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $KUBELET_HEALTHZ_PORT
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $STATE_DIR/pki/ca.crt}
authorization: {mode: Webhook}
containerRuntimeEndpoint: unix://$CTRD_SOCK
cgroupDriver: cgroupfs
# This machine mounts cgroup v1 controllers (see docs/testing-node.md).
failCgroupV1: false
failSwapOn: false
podLogsDir: $N/pod-logs
podCIDR: $POD_CIDR
resolvConf: ""
clusterDomain: cluster.local
# Workload images are pulled from the cluster's registry; the sandbox image is imported
# (no registry has it): the image GC must not remove it.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "50Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
serializeImagePulls: false
maxPods: 110
EOF
  start kubelet "$BIN_DIR/kubelet" --config "$N/kubelet-config.yaml" \
    --kubeconfig "$STATE_DIR/kubelet.kubeconfig" --root-dir "$N/kubelet" --cert-dir "$N/kubelet/pki" \
    --hostname-override "$NODE_NAME" --node-ip "$NODE_IP" --v 1
}

node_ready() {
  [[ $(kubectl get node "$NODE_NAME" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null) == True ]]
}

healthy() {
  local c
  for c in containerd kube-scheduler kubelet apiserver-proxy; do pid_alive "$c" || return 1; done
  node_ready
}

# Whether a component of the cluster in state directory $1 runs: its pid file names a live
# process that is still that program (a pid file outlives a killed session, and its pid
# may since belong to something else).
component_runs() { # state_dir component program
  local f=$1/$2.pid pid
  [[ -f $f ]] || return 1
  pid=$(cat "$f")
  kill -0 "$pid" 2>/dev/null && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -- "$3" >/dev/null
}

# One node per machine. Another cluster's node that still runs is left alone (refused);
# one whose processes are all gone (its session was killed: mounts, the bridge, pod
# cgroups and the owner file survive it) is torn down with its own state directory, so a
# fresh run never inherits a dead run's leftovers.
take_over_stale_owner() {
  [[ -f $OWNER ]] || return 0
  local other c
  other=$(cat "$OWNER")
  [[ $other != "$STATE_DIR" ]] || return 0
  for c in containerd:containerd kubelet:kubelet kube-scheduler:kube-scheduler apiserver-proxy:socat; do
    if component_runs "$other" "${c%%:*}" "${c#*:}"; then
      log "the node of another cluster ($other) runs on this machine; stop it, or start this cluster with NODE=0"
      exit 1
    fi
  done
  if [[ -d $other/node ]]; then
    log "the node of $other is dead (no process left); cleaning up what it left behind"
    STATE_DIR=$other bash "${BASH_SOURCE[0]}" down || { log "could not clean up the dead node of $other"; exit 1; }
  fi
  rm -f "$OWNER"
}

up() {
  local t0=$SECONDS
  if healthy; then
    log "reusing the running node"
    return 0
  fi
  down_quiet
  take_over_stale_owner
  mkdir -p "$N"
  echo "$STATE_DIR" >"$OWNER"
  for b in kubelet kube-scheduler; do
    [[ -x $BIN_DIR/$b ]] || { log "missing $BIN_DIR/$b (run make node-deps)"; exit 1; }
  done
  for b in containerd runc containerd-shim-runc-v2 socat ctr "$CNI_BIN_DIR/bridge"; do
    command -v "$b" >/dev/null || { log "missing $b (run make node-deps, which installs it)"; exit 1; }
  done
  node_cert
  start_scheduler
  network_up
  # The kubernetes Service's address on the bridge, forwarded to the API server on loopback
  # (kube-proxy's job in a real cluster, for this one Service).
  start apiserver-proxy "$(command -v socat)" \
    "TCP-LISTEN:443,bind=$KUBERNETES_SERVICE_IP,reuseaddr,fork" "TCP:127.0.0.1:$APISERVER_PORT"
  start_containerd
  import_pause_image
  start_kubelet
  wait_for kubelet "node $NODE_NAME Ready" node_ready
  log "node $NODE_NAME Ready in $((SECONDS - t0))s"
}

# Processes left in the kubelet's pod cgroups (containers whose shim is gone), then the
# cgroups themselves.
kill_pod_cgroups() {
  local d
  for d in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/unified/kubepods /sys/fs/cgroup/kubepods; do
    [[ -d $d ]] || continue
    find "$d" -name cgroup.procs -exec cat {} + 2>/dev/null | sort -u | xargs -r kill -KILL 2>/dev/null || true
  done
  sleep 0.2
  for d in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/unified/kubepods /sys/fs/cgroup/kubepods; do
    [[ -d $d ]] || continue
    find "$d" -depth -type d -exec rmdir {} + 2>/dev/null || true
  done
}

unmount_under() { # dir
  local m
  { findmnt -rn -o TARGET | grep -F "$1/" || true; } | sort -r | while read -r m; do
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
  done
}

down_quiet() {
  # Nothing of ours to stop: never touch the machine-wide parts another cluster owns.
  [[ -d $N ]] || return 0
  # Pods first, through the API, while the kubelet runs: it stops their containers and
  # tears their network down (CNI DEL) like any node would.
  if pid_alive kubelet && kubectl get --raw /readyz >/dev/null 2>&1; then
    kubectl delete pods --all-namespaces --all --force --grace-period=0 --wait=false >/dev/null 2>&1 || true
    for _ in $(seq 1 50); do
      [[ -z $(ctr -n k8s.io tasks ls -q 2>/dev/null) ]] && break
      sleep 0.2
    done
  fi
  stop_pid kubelet
  stop_pid kube-scheduler
  # What the kubelet did not stop: kill the tasks, then the shims, then containerd.
  if pid_alive containerd; then
    local t
    for t in $(ctr -n k8s.io tasks ls -q 2>/dev/null); do
      ctr -n k8s.io tasks kill -s SIGKILL "$t" >/dev/null 2>&1 || true
    done
  fi
  # Shims were started by our containerd with our socket in their arguments.
  local shims
  shims=$(pgrep -f -- "containerd-shim-runc-v2 .*-address $CTRD_SOCK" || true)
  stop_pid containerd
  # shellcheck disable=SC2086
  [[ -n $shims ]] && kill -KILL $shims 2>/dev/null || true
  kill_pod_cgroups
  stop_pid apiserver-proxy
  unmount_under "$N"
  # Sandbox network namespaces (containerd mounts them under /run/netns as cni-*).
  local ns
  for ns in /run/netns/cni-*; do
    [[ -e $ns ]] || continue
    umount "$ns" 2>/dev/null || umount -l "$ns" 2>/dev/null || true
    rm -f "$ns"
  done
  if ip link show "$BRIDGE" >/dev/null 2>&1; then ip link del "$BRIDGE"; fi
  rm -rf "$N"
  rm -f "$OWNER"
}

down() {
  # A cluster that never ran the node (NODE=0, e.g. the chaos suite's) has nothing to
  # stop or check: the machine-wide parts (socat on the Service IP) belong to another.
  [[ -d $N ]] || return 0
  down_quiet
  local left
  left=$(findmnt -rn -o TARGET | grep -F "$N/" || true)
  [[ -z $left ]] || { log "still mounted after down:"; echo "$left" >&2; exit 1; }
  left=$(pgrep -af -- "$N/|-address $CTRD_SOCK|bind=$KUBERNETES_SERVICE_IP" || true)
  [[ -z $left ]] || { log "still running after down:"; echo "$left" >&2; exit 1; }
}

case ${1:-} in
  up) up ;;
  down) down ;;
  status) healthy ;;
  *)
    echo "usage: $0 up|down|status" >&2
    exit 2
    ;;
esac
