#!/usr/bin/env bash
# The fencing story with real pods on the local node (`make demo-cluster`):
#   the chart's controller and examples/ledger run as pods; the holder pod is frozen
#   (cgroup freezer) past its lease; another pod is granted a higher token and writes;
#   the frozen pod resumes, its write is refused by the API server, its `palisade lock`
#   exits 75, and the kubelet restarts the container, which competes again.
#
# Needs: KUBECONFIG (make cluster, with its node), KUBECTL, HELM, the images `make
# image-local` pushes to the cluster's registry (PALISADE_TEST_REGISTRY; PALISADE_IMAGE and
# EXAMPLE_IMAGE name them), and root (the freezer is the node's cgroup v1 freezer).
# Exits 0 only when every step of the story happened.
set -euo pipefail

: "${KUBECONFIG:?set KUBECONFIG}" "${KUBECTL:=kubectl}" "${HELM:=helm}"
export KUBECONFIG
root=$(cd "$(dirname "$0")/../.." && pwd)
app_version=$(awk '$1 == "appVersion:" {gsub(/"/, "", $2); print $2}' "$root/charts/palisade/Chart.yaml")
registry=${PALISADE_TEST_REGISTRY:-127.0.0.1:15005}
PALISADE_IMAGE=${PALISADE_IMAGE:-$registry/palisade:$app_version}
EXAMPLE_IMAGE=${EXAMPLE_IMAGE:-$registry/palisade-example:$app_version}
SYSTEM_NS=${DEMO_SYSTEM_NAMESPACE:-palisade-system}
NS=${DEMO_NAMESPACE:-palisade-demo-cluster}
FREEZER=/sys/fs/cgroup/freezer
frozen=""

k() { "$KUBECTL" "$@"; }
cleanup() {
  [[ -n $frozen && -e $frozen/freezer.state ]] && echo THAWED >"$frozen/freezer.state" || true
  # The release is the demo's own (it refuses to start when one exists): leave none behind.
  "$HELM" uninstall palisade -n "$SYSTEM_NS" --wait >/dev/null 2>&1 || true
  k delete namespace "$NS" --wait=false >/dev/null 2>&1 || true
}
trap cleanup EXIT

say() { printf '\n\033[1m%s\033[0m\n' "$*"; }
step() { printf '  %s\n' "$*"; }
fail() { echo "demo-cluster: $*" >&2; exit 1; }
wait_for() { # seconds description command...
  local deadline=$((SECONDS + $1)) what=$2
  shift 2
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || fail "timed out waiting for $what"
    sleep 0.2
  done
}
lease() { k -n "$NS" get leases.palisade.dev ledger -o "jsonpath={$1}" 2>/dev/null; }
cm() { k -n "$NS" get configmap ledger -o "jsonpath={$1}" 2>/dev/null; }
pod_ns() { # name: a namespace whose pods run on the node, Pod Security "restricted"
  k create namespace "$1" >/dev/null 2>&1 || true
  k label namespace "$1" --overwrite pod-security.kubernetes.io/enforce=restricted >/dev/null
  k annotate namespace "$1" --overwrite scheduler.alpha.kubernetes.io/node-selector= >/dev/null
}

say "1. The controller: the chart, as pods"
if "$HELM" status palisade -n "$SYSTEM_NS" >/dev/null 2>&1; then
  trap - EXIT
  fail "a release palisade already exists in $SYSTEM_NS; the demo installs its own (helm uninstall palisade -n $SYSTEM_NS)"
fi
k delete namespace "$NS" --ignore-not-found --wait=true >/dev/null
pod_ns "$SYSTEM_NS"
pod_ns "$NS"
# The CRDs outlive releases and the tests apply them too: applied here, not owned by the
# release (crds.enabled=false, docs/operating.md "CRDs").
k apply --server-side --force-conflicts -f "$root/crds/palisade.dev.yaml" >/dev/null
"$HELM" upgrade --install palisade "$root/charts/palisade" -n "$SYSTEM_NS" --set crds.enabled=false \
  --set image.repository="${PALISADE_IMAGE%:*}" --set image.tag="${PALISADE_IMAGE##*:}" \
  --set controller.watchNamespace="$NS" \
  --set "policies.namespaceSelector.matchLabels.kubernetes\.io/metadata\.name=$NS" \
  --wait --timeout 120s >/dev/null
step "$(k -n "$SYSTEM_NS" get deployment palisade --no-headers | awk '{print "deployment palisade: " $2 " ready"}')"

say "2. The workload: examples/ledger, 3 pods contending for Lease ledger"
# The example as is, with a longer critical section so the holder can be frozen inside it.
awk '/name: WORK_SECONDS/ {print; getline; sub(/"2"/, "\"4\"")} {print}' "$root/examples/ledger/ledger.yaml" |
  sed "s|image: .*/palisade-example:.*|image: $EXAMPLE_IMAGE|" |
  k -n "$NS" apply -f - >/dev/null
k -n "$NS" rollout status deployment/ledger-writer --timeout 120s >/dev/null
wait_for 60 "a holder in its critical section" bash -c "[[ \$($KUBECTL -n $NS get configmap ledger -o jsonpath='{.data.phase}') == enter ]]"
holder=$(cm .data.holder)
token=$(cm .data.token)
step "holder: pod $holder, fencing token $token, in its critical section (ConfigMap phase=enter)"

say "3. Freeze the holder pod (cgroup freezer) past its lease ($(lease .spec.leaseDurationSeconds)s)"
uid=$(k -n "$NS" get pod "$holder" -o jsonpath='{.metadata.uid}')
restarts=$(k -n "$NS" get pod "$holder" -o jsonpath='{.status.containerStatuses[0].restartCount}')
frozen=$(find "$FREEZER/kubepods" -maxdepth 2 -type d -name "pod$uid" | head -n1)
[[ -n $frozen ]] || fail "no freezer cgroup for pod $holder (uid $uid) under $FREEZER/kubepods"
echo FROZEN >"$frozen/freezer.state"
step "frozen: $frozen"

say "4. Another pod is granted a higher token and writes"
wait_for 60 "a grant to another pod" bash -c "h=\$($KUBECTL -n $NS get leases.palisade.dev ledger -o jsonpath='{.status.holder.identity}'); [[ -n \$h && \$h != $holder ]]"
wait_for 30 "the new holder's write" bash -c "[[ \$($KUBECTL -n $NS get configmap ledger -o jsonpath='{.data.holder}') != $holder ]]"
new_holder=$(cm .data.holder)
new_token=$(cm .metadata.annotations.palisade\\.dev/fencing-token)
step "pod $new_holder holds token $new_token and wrote the ConfigMap"
((new_token > token)) || fail "the new token $new_token is not higher than $token"

say "5. Thaw the frozen pod: its write carries the stale token $token"
echo THAWED >"$frozen/freezer.state"
frozen=""
wait_for 60 "the thawed container to exit and be restarted" bash -c \
  "[[ \$($KUBECTL -n $NS get pod $holder -o jsonpath='{.status.containerStatuses[0].restartCount}') -gt $restarts ]]"
code=$(k -n "$NS" get pod "$holder" -o jsonpath='{.status.containerStatuses[0].lastState.terminated.exitCode}')
logs=$(k -n "$NS" logs "$holder" --previous 2>&1 || true)
refused=$(grep -m1 -o 'stale fencing token[^;]*' <<<"$logs" || true)
# The command and its `palisade lock` wake at the same moment: either the write goes
# out first and the API server refuses it, or `palisade lock` sees its local deadline has
# passed and stops the command before it writes. Both are safe; a stale write that
# succeeded ("token N: exit") is the failure.
if [[ -n $refused ]]; then
  step "its write: $refused"
elif grep -q "lost lease" <<<"$logs" && ! grep -q "token $token: exit" <<<"$logs"; then
  step "its write was never sent: its palisade lock woke first, saw the local deadline had passed, and stopped it"
else
  echo "$logs" >&2
  fail "the stale holder's write was neither refused nor stopped"
fi
step "its palisade lock exited $code; the kubelet restarted the container (restarts: $restarts -> $((restarts + 1)))"
[[ $code == 75 ]] || { echo "$logs" >&2; fail "palisade lock exited $code, expected 75 (lease lost)"; }
[[ $(cm .metadata.annotations.palisade\\.dev/fencing-token) -ge $new_token ]] || fail "the ConfigMap lost the newer token"

say "6. The restarted container competes again"
wait_for 60 "the restarted pod to be Ready" bash -c \
  "[[ \$($KUBECTL -n $NS get pod $holder -o jsonpath='{.status.containerStatuses[0].state.running}') != '' ]]"
step "pod $holder is running again; ConfigMap token $(cm .metadata.annotations.palisade\\.dev/fencing-token), holder $(cm .data.holder)"
say "Done: the frozen holder could not write with its stale token, and it exited 75."
