#!/usr/bin/env bash
# A real operator's deposed leader, fenced and not (`make chaospod-check`).
#
# controller-runtime's example operator (examples/crd of sigs.k8s.io/controller-runtime)
# reconciles ChaosPods: it creates a Pod from each one's spec.template, owned by it, then
# Updates the ChaosPod (spec.nextStop 10 or 20 s ahead, status.lastRun the Pod's creation),
# and deletes the Pod once nextStop has passed (to create it again). Built with one file
# of ours (leadership.go), it elects its leader with controller-runtime's own leader
# election (client-go's, on a coordination.k8s.io Lease), or with palisadekube.RunOrDie on
# a palisade Lease, the chart's policies.operators naming its service account and Lease.
# For each mode in turn (never both at once: the operator watches ChaosPods and Pods in
# every namespace), 3 replicas run on the node, then in each round:
#   1. every ChaosPod's nextStop is set in the past: the leader deletes their Pods and
#      makes them again (it is busy doing so as it is frozen);
#   2. its operator container is frozen (cgroup freezer; the palisade agent beside it runs
#      on) past its lease, until another replica leads and has reconciled every ChaosPod;
#   3. meanwhile the ChaosPods change (one deleted, one created, one's nextStop set in the
#      past so its Pod must be deleted and made again) and the new leader reconciles them;
#   4. every ChaosPod's nextStop is set in the past again, and the old one is thawed: both
#      leaders have Pods to delete and make, the old one from what its caches held when
#      it froze (they catch up as it runs on). client-go's elector believes it leads until
#      its renew deadline (3 s here) runs out, and controller-runtime then stops the
#      manager; with palisade the manager runs on for STOP_GRACE after it learns it lost
#      the Lease (leadership.go --stop-grace); then it exits;
#   5. from the API server's audit log (tests/controlplane/audit-policy.yaml: the writes of
#      the two namespaces' service accounts), the old leader pod's writes of ChaosPods, Pods
#      and Events received after the new leader's first write: accepted, refused by the
#      fence, or refused otherwise.
# palisade must have every one that would change something refused (0 accepted, more than
# 0 refused by the fence: with none the round proves nothing and is repeated, MAX_ROUNDS
# at most, as is a round whose new leader lost the Lease too); client-go's accepted ones
# are counted, not required (0 can happen by timing).
# Both must end with every ChaosPod owning its Pod, made after step 4, its lastRun
# that Pod's creation and its nextStop after it (as the leader writes them), and no Pod
# without its ChaosPod; with palisade no object's last change is the old leader's. Prints
# a table; exits non-zero naming what went wrong; removes what it made.
#
# The ChaosPods' Pods are deleted at once (terminationGracePeriodSeconds 0). A Pod deleted
# gracefully stays, being deleted, for its grace period, and the API server answers a
# second delete of it meanwhile (the old leader's, its caches lagging behind the new
# one's) 200 without admission, as it leaves a deletion under way as it is: such a delete
# changes nothing and no policy judges it, but the audit log cannot always tell it from
# one that was judged (two deletes of one Pod can be under way at once). Deleted at once,
# every delete of a Pod is judged, or answered 404.
#
# Why STOP_GRACE: thawed, palisade's client sees at once that its grant's deadline has
# passed and cancels the manager's context, and controller-runtime stops its workers and
# cancels their requests: with 0 the old leader sent nothing after the new leader's first
# write in any of 6 rounds here, and a round with nothing refused proves nothing. client-go's
# elector gives its deposed leader its renew deadline of running on by design; 3 s gives
# palisade's the same window, so the two modes' deposed leaders get the same chance.
#
# The example registers its ChaosPod with the webhook builder, but ChaosPod has no
# defaulter, validator or conversion: nothing is registered, the webhook server is never
# added to the manager and needs no serving certificate. The ChaosPods' Pods run the
# node's pause image (imported by node.sh; imagePullPolicy Never): nothing is pulled.
#
# Needs: KUBECONFIG (make cluster, with its node), KUBECTL, HELM, jq, root (the node's
# cgroup v1 freezer), AUDIT_LOG (the API server's audit log), and two images in the
# cluster's registry (PALISADE_TEST_REGISTRY): the palisade image (PALISADE_IMAGE, `make
# image-local`) and the operator's (OPERATOR_IMAGE, `make chaospod-image`).
set -euo pipefail

: "${KUBECONFIG:?set KUBECONFIG}" "${KUBECTL:=kubectl}" "${HELM:=helm}" "${AUDIT_LOG:?set AUDIT_LOG to the audit log of the API server}"
export KUBECONFIG
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
app_version=$(awk '$1 == "appVersion:" {gsub(/"/, "", $2); print $2}' "$root/charts/palisade/Chart.yaml")
registry=${PALISADE_TEST_REGISTRY:-127.0.0.1:15005}
PALISADE_IMAGE=${PALISADE_IMAGE:-$registry/palisade:$app_version}
OPERATOR_IMAGE=${OPERATOR_IMAGE:-$registry/chaospod:1}
POD_IMAGE=${POD_IMAGE:-palisade.local/pause:1}
MODES=${MODES:-palisade client-go}
MAX_ROUNDS=${MAX_ROUNDS:-3}
STOP_GRACE=${STOP_GRACE:-3s} # palisade's; see above
FREEZER=/sys/fs/cgroup/freezer
CRD=chaospods.chaosapps.metamagical.io
run=$(date +%s)
SYSTEM_NS=chaospod-system-$run
RELEASE=cp-$run # fullname cp-<run>-palisade: its own ClusterRoles and policies
SA=chaospod
LEASE=chaospod
PAST=2000-01-01T00:00:00Z # a nextStop that has passed
CHAOSPODS=()
for i in $(seq 1 "${CHAOSPOD_COUNT:-6}"); do CHAOSPODS+=("cp-$i"); done

frozen=""
mode="" NS="" CP_NS="" round=0 mode_started=""
declare -A sent accepted refused others rounds_of last_old

k() { "$KUBECTL" "$@"; }
say() { printf '\n\033[1m%s\033[0m\n' "$*"; }
step() { printf '  %s\n' "$*"; }
now() { date -u +%Y-%m-%dT%H:%M:%S.%6NZ; } # the audit log's timestamps, same clock
fail() {
  echo "chaospod check (${mode:-setup}, round $round): $*" >&2
  if [[ -n $NS ]]; then
    k -n "$NS" get pods -o wide >&2 2>/dev/null || true
    k -n "$CP_NS" get chaospods,pods >&2 2>/dev/null || true
    for p in $(k -n "$NS" get pods -o name 2>/dev/null); do
      echo "--- $p" >&2
      k -n "$NS" logs "$p" -c operator --tail 12 >&2 2>/dev/null || true
      k -n "$NS" logs "$p" -c operator --previous --tail 12 >&2 2>/dev/null || true
    done
  fi
  exit 1
}
thaw() {
  [[ -n $frozen && -e $frozen/freezer.state ]] && echo THAWED >"$frozen/freezer.state" || true
  frozen=""
}
remove_mode() { # mode: its operator first (it writes in any namespace), then the rest
  local ns=chaospod-$1
  k -n "$ns" delete deployment "$SA" --cascade=foreground --wait --timeout 60s >/dev/null 2>&1 || true
  k delete clusterrolebinding "$SA-$1" --ignore-not-found >/dev/null 2>&1 || true
  k delete clusterrole "$SA-$1" --ignore-not-found >/dev/null 2>&1 || true
  k delete namespace "$ns" "$ns-chaospods" --ignore-not-found --wait=false >/dev/null 2>&1 || true
}
cleanup() {
  thaw
  local m
  for m in $MODES; do remove_mode "$m"; done
  "$HELM" uninstall "$RELEASE" -n "$SYSTEM_NS" --wait --timeout 60s >/dev/null 2>&1 || true
  k delete namespace "$SYSTEM_NS" --wait=false >/dev/null 2>&1 || true
  k delete crd "$CRD" --wait=false >/dev/null 2>&1 || true
}
trap cleanup EXIT
wait_for() { # seconds description command...
  local deadline=$((SECONDS + $1)) what=$2
  shift 2
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || fail "timed out after $1 s waiting for $what"
    sleep 0.3
  done
}

# --- the cluster's view ---------------------------------------------------------------

holder() { # the leader's pod (controller-runtime's identity is <host name>_<uuid>)
  local h
  if [[ $mode == palisade ]]; then
    h=$(k -n "$NS" get leases.palisade.dev "$LEASE" -o jsonpath='{.status.holder.identity}' 2>/dev/null)
  else
    h=$(k -n "$NS" get leases.coordination.k8s.io "$LEASE" -o jsonpath='{.spec.holderIdentity}' 2>/dev/null)
  fi
  echo "${h%%_*}"
}
holder_is_not() { local h; h=$(holder); [[ -n $h && $h != "$1" ]]; }
restarts() { # pod: its operator container's restarts
  k -n "$NS" get pod "$1" -o jsonpath='{.status.containerStatuses[?(@.name=="operator")].restartCount}'
}
restarted_since() { (($(restarts "$1") > $2)); }
some_pod_deleted() { # some Pod of a ChaosPod is being deleted, or gone
  local pods
  pods=$(k -n "$CP_NS" get pods -o json) || return 1
  jq -e --argjson n "$1" '(.items | length) < $n or ([.items[] | select(.metadata.deletionTimestamp)] | length) > 0' <<<"$pods"
}
# Every ChaosPod has its Pod, controlled by it, running its template's image and not
# being deleted, with status.lastRun that Pod's creation and spec.nextStop after it (what
# the leader writes once it made the Pod); no other Pod is left. Arguments NAME=TIME:
# that ChaosPod's Pod was made at TIME or later. Prints the first difference, exit 1,
# when there is one.
converged() {
  local cps pods after
  after=$(printf '%s\n' "$@" | jq -Rn '[inputs | select(. != "") | split("=") | {key: .[0], value: .[1]}] | from_entries')
  cps=$(k -n "$CP_NS" get chaospods -o json) && pods=$(k -n "$CP_NS" get pods -o json) || { echo "cannot list"; return 1; }
  jq -rn --argjson cps "$cps" --argjson pods "$pods" --argjson after "$after" '
    def sec: sub("\\.[0-9]+Z$"; "Z");
    ($pods.items | map({key: .metadata.name, value: .}) | from_entries) as $p
    | [ $cps.items[] | . as $c | $c.metadata.name as $n | $p[$n] as $pod
        | if $pod == null then "ChaosPod \($n): no Pod"
          elif ([$pod.metadata.ownerReferences[]? | select(.controller and .uid == $c.metadata.uid)] | length) == 0
            then "Pod \($n): not controlled by ChaosPod \($n)"
          elif $pod.metadata.deletionTimestamp != null then "Pod \($n): being deleted"
          elif $pod.spec.containers[0].image != $c.spec.template.spec.containers[0].image
            then "Pod \($n): image \($pod.spec.containers[0].image), its ChaosPod says \($c.spec.template.spec.containers[0].image)"
          elif ($c.status.lastRun // null) == null or ($c.status.lastRun | sec) != $pod.metadata.creationTimestamp
            then "ChaosPod \($n): lastRun \($c.status.lastRun // "none"), its Pod made \($pod.metadata.creationTimestamp)"
          elif ($c.spec.nextStop // "" | sec) <= ($c.status.lastRun | sec)
            then "ChaosPod \($n): nextStop \($c.spec.nextStop // "none") not after its lastRun \($c.status.lastRun)"
          elif $after[$n] != null and $pod.metadata.creationTimestamp < ($after[$n] | sub("\\.[0-9]+Z$"; "Z"))
            then "Pod \($n): made \($pod.metadata.creationTimestamp), before its ChaosPod changed at \($after[$n])"
          else empty end ]
    + [ ($cps.items | map(.metadata.name)) as $wanted | $pods.items[].metadata.name
        | select(. as $n | $wanted | index($n) | not) | "Pod \(.): no ChaosPod owns it" ]
    | if length > 0 then (.[0], halt_error(1)) else "ok" end' 2>&1
}

# --- the audit log --------------------------------------------------------------------

# The operator's writes (ChaosPods, Pods, Events) in the ChaosPods' namespace since $1,
# one per line: received-at answered-at pod verb resource/subresource/name code token
# message.
writes_since() {
  local logs=("$AUDIT_LOG")
  compgen -G "${AUDIT_LOG%.log}-*.log" >/dev/null && logs=("${AUDIT_LOG%.log}"-*.log "$AUDIT_LOG")
  cat "${logs[@]}" | jq -r --arg ns "$CP_NS" --arg since "$1" '
    select(.stage == "ResponseComplete" and .objectRef.namespace == $ns and .requestReceivedTimestamp >= $since
      and (.objectRef.resource == "chaospods" or .objectRef.resource == "pods" or .objectRef.resource == "events"))
    | [ .requestReceivedTimestamp,
        .stageTimestamp,
        (.user.extra["authentication.kubernetes.io/pod-name"][0] // "-"),
        .verb,
        (.objectRef.resource + (if (.objectRef.subresource // "") != "" then "/" + .objectRef.subresource else "" end)
          + "/" + (.objectRef.name // "-")),
        (.responseStatus.code // 0 | tostring),
        (.impersonatedUser.extra["palisade.dev/fencing-token"][0] // "-"),
        ((.responseStatus.message // "") | gsub("[\t\n]"; " ")
          | if test("fencing token") then sub(".*denied request: "; "") else .[0:140] end) ] | @tsv' | sort
}
# The writes of pod $2 (all: empty) received after $3, from the writes $1 (writes_since),
# each with its class first: accepted; fenced (refused by the fence: 403, "fencing
# token"); other (refused otherwise: 409 conflict, 404, ...).
classify() {
  awk -F'\t' -v p="$2" -v t="$3" '(p == "" || $3 == p) && $1 > t {
      class = "other"
      if ($6 ~ /^2/) class = "accepted"
      else if ($6 == 403 && $8 ~ /fencing token/) class = "fenced"
      print class "\t" $0
    }' <<<"$1"
}

# --- set-up -------------------------------------------------------------------------

chaospod_yaml() { # name
  cat <<EOF
apiVersion: chaosapps.metamagical.io/v1
kind: ChaosPod
metadata: {name: $1}
spec:
  template:
    metadata: {labels: {app: chaospod-pause}}
    spec:
      automountServiceAccountToken: false
      enableServiceLinks: false
      terminationGracePeriodSeconds: 0
      securityContext: {runAsNonRoot: true, runAsUser: 65535, runAsGroup: 65535, seccompProfile: {type: RuntimeDefault}}
      containers:
        - name: pause
          image: $POD_IMAGE
          imagePullPolicy: Never
          securityContext: {allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, capabilities: {drop: [ALL]}}
          resources: {requests: {cpu: 1m, memory: 4Mi}, limits: {memory: 16Mi}}
---
EOF
}
operator_yaml() {
  local agent="" rbac_election election_args env_agent=""
  if [[ $mode == palisade ]]; then
    election_args="[--election=palisade, --lease-name=$LEASE, --lease-duration=5s, --retry-period=1s, --stop-grace=$STOP_GRACE]"
    # Leases and LeaseClaims: the chart's client role, for the agent.
    rbac_election="apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: $SA-palisade-client}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: $RELEASE-palisade-client}
subjects: [{kind: ServiceAccount, name: $SA, namespace: $NS}]"
    # The agent, a native sidecar (examples/go-leader-redis/deployment.yaml): not frozen
    # with the operator, it ends the session the frozen process no longer keeps alive.
    agent="      initContainers:
        - name: palisade-agent
          image: $PALISADE_IMAGE
          imagePullPolicy: Always
          restartPolicy: Always
          args: [agent, --socket=/run/palisade/agent.sock, --token-dir=/run/palisade/leases]
          env:
            - {name: POD_NAME, valueFrom: {fieldRef: {fieldPath: metadata.name}}}
            - {name: POD_UID, valueFrom: {fieldRef: {fieldPath: metadata.uid}}}
            - {name: POD_NAMESPACE, valueFrom: {fieldRef: {fieldPath: metadata.namespace}}}
          securityContext: {allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, capabilities: {drop: [ALL]}}
          resources: {requests: {cpu: 10m, memory: 16Mi}, limits: {memory: 64Mi}}
          volumeMounts: [{name: palisade, mountPath: /run/palisade}]"
    env_agent="            - {name: PALISADE_AGENT_SOCKET, value: /run/palisade/agent.sock}"
  else
    election_args="[--election=client-go, --lease-name=$LEASE, --lease-duration=5s, --renew-deadline=3s, --retry-period=1s]"
    rbac_election="apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: $SA-election}
rules: [{apiGroups: [coordination.k8s.io], resources: [leases], verbs: [get, create, update]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: $SA-election}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: $SA-election}
subjects: [{kind: ServiceAccount, name: $SA, namespace: $NS}]"
  fi
  cat <<EOF
apiVersion: v1
kind: ServiceAccount
metadata: {name: $SA}
---
# What the operator reads and writes, in every namespace (its caches list them all), and
# its Events (controller-runtime's leader election records some).
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: $SA-$mode}
rules:
  - {apiGroups: [chaosapps.metamagical.io], resources: [chaospods], verbs: [get, list, watch, update]}
  - {apiGroups: [""], resources: [pods], verbs: [get, list, watch, create, delete]}
  - {apiGroups: ["", events.k8s.io], resources: [events], verbs: [create, patch, update]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: $SA-$mode}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: $SA-$mode}
subjects: [{kind: ServiceAccount, name: $SA, namespace: $NS}]
---
$rbac_election
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: $SA}
spec:
  replicas: 3
  selector: {matchLabels: {app: $SA}}
  template:
    metadata: {labels: {app: $SA}}
    spec:
      serviceAccountName: $SA
      terminationGracePeriodSeconds: 5
      securityContext: {runAsNonRoot: true, runAsUser: 65532, runAsGroup: 65532, seccompProfile: {type: RuntimeDefault}}
$agent
      containers:
        - name: operator
          image: $OPERATOR_IMAGE
          imagePullPolicy: Always
          args: $election_args
          env:
            - {name: POD_NAME, valueFrom: {fieldRef: {fieldPath: metadata.name}}}
            - {name: POD_NAMESPACE, valueFrom: {fieldRef: {fieldPath: metadata.namespace}}}
$env_agent
          securityContext: {allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, capabilities: {drop: [ALL]}}
          resources: {requests: {cpu: 20m, memory: 32Mi}, limits: {memory: 192Mi}}
          volumeMounts: [{name: palisade, mountPath: /run/palisade}]
      volumes: [{name: palisade, emptyDir: {}}]
EOF
}

setup_mode() {
  say "$mode: namespace $NS (3 replicas of the operator), ChaosPods in $CP_NS"
  mode_started=$(now)
  # The names are fixed (the audit policy names them): a run that died left them behind.
  remove_mode "$mode"
  k wait --for=delete "namespace/$NS" "namespace/$CP_NS" --timeout 120s >/dev/null 2>&1 ||
    fail "namespaces $NS and $CP_NS left by an earlier run are still being deleted after 120 s"
  # Pods run on the node only in namespaces with this annotation, empty: the operator's
  # and the ChaosPods' do.
  local ns
  for ns in "$NS" "$CP_NS"; do
    k create namespace "$ns" >/dev/null
    k annotate namespace "$ns" --overwrite scheduler.alpha.kubernetes.io/node-selector= >/dev/null
  done
  if [[ $mode == palisade ]]; then
    "$HELM" upgrade --install "$RELEASE" "$root/charts/palisade" -n "$SYSTEM_NS" --set crds.enabled=false \
      --set image.repository="${PALISADE_IMAGE%:*}" --set image.tag="${PALISADE_IMAGE##*:}" \
      --set image.pullPolicy=Always --set controller.watchNamespace="$NS" \
      --set "policies.namespaceSelector.matchLabels.kubernetes\.io/metadata\.name=$NS" \
      --set "policies.operators[0].serviceAccount.namespace=$NS" \
      --set "policies.operators[0].serviceAccount.name=$SA" \
      --set "policies.operators[0].lease.name=$LEASE" \
      --wait --timeout 120s >/dev/null || fail "the chart did not install as release $RELEASE in $SYSTEM_NS"
    step "the chart: release $RELEASE, fencing every write of system:serviceaccount:$NS:$SA by Lease $NS/$LEASE"
  fi
  operator_yaml | k -n "$NS" apply -f - >/dev/null || fail "the operator's manifests did not apply"
  local c
  for c in "${CHAOSPODS[@]}"; do chaospod_yaml "$c"; done | k -n "$CP_NS" apply -f - >/dev/null ||
    fail "the ChaosPods did not apply"
  k -n "$NS" rollout status deployment/"$SA" --timeout 120s >/dev/null || fail "the operator's 3 replicas did not become ready"
  wait_for 60 "a leader" holder_is_not ""
  wait_for 60 "the leader to reconcile the ${#CHAOSPODS[@]} ChaosPods" converged
  step "leader $(holder); ${#CHAOSPODS[@]} ChaosPods reconciled, each with its Pod on the node"
}

# One round: freeze the leader, change the ChaosPods, thaw, count. Sets the round's counts.
freeze_round() {
  local old since cgroup before id uid cps
  old=$(holder)
  say "$mode, round $round: freeze leader $old past its lease"
  id=$(k -n "$NS" get pod "$old" -o jsonpath='{.status.containerStatuses[?(@.name=="operator")].containerID}')
  uid=$(k -n "$NS" get pod "$old" -o jsonpath='{.metadata.uid}')
  cgroup=$(find "$FREEZER/kubepods" -maxdepth 3 -type d -path "*pod$uid/${id#containerd://}" 2>/dev/null | head -n1)
  [[ -n $cgroup && -w $cgroup/freezer.state ]] || fail "no freezer cgroup for the operator container of pod $old (uid $uid, ${id:-no container id}) under $FREEZER/kubepods"
  before=$(restarts "$old")
  # Keep it busy as it freezes: every ChaosPod's Pod is to be deleted and made again, so
  # it is mid-reconcile (requests on their way, Pods to make once the old ones are gone)
  # at a moment that varies from round to round.
  mapfile -t cps < <(k -n "$CP_NS" get chaospods -o jsonpath='{range .items[*]}{.metadata.name}{"\n"}{end}')
  k -n "$CP_NS" patch chaospods "${cps[@]}" --type merge -p "{\"spec\":{\"nextStop\":\"$PAST\"}}" >/dev/null ||
    fail "setting the ChaosPods' nextStop in the past did not apply"
  wait_for 20 "leader $old to start deleting the ChaosPods' Pods" some_pod_deleted "${#cps[@]}"
  sleep "$((RANDOM % 2)).$((RANDOM % 10))"
  since=$(now)
  echo FROZEN >"$cgroup/freezer.state"
  frozen=$cgroup
  wait_for 10 "the operator container of $old to freeze" grep -qx FROZEN "$cgroup/freezer.state"
  step "frozen: its operator container (the rest of the pod runs on), remaking the ChaosPods' Pods"

  wait_for 60 "another replica to take the Lease from frozen $old" holder_is_not "$old"
  local new
  new=$(holder)
  step "pod $new leads after $(($(date +%s%N) / 1000000 - $(date -d "$since" +%s%N) / 1000000)) ms"
  wait_for 60 "the new leader $new to reconcile the ChaosPods" converged
  # The ChaosPods change while it is frozen: one deleted, one created, one's Pod to go.
  local gone=${cps[0]} stopped=${cps[1]} born=cp-r$round-$run changed
  chaospod_yaml "$born" | k -n "$CP_NS" apply -f - >/dev/null || fail "ChaosPod $born could not be created"
  k -n "$CP_NS" delete chaospod "$gone" --wait=false >/dev/null || fail "ChaosPod $gone could not be deleted"
  changed=$(now)
  k -n "$CP_NS" patch chaospod "$stopped" --type merge -p "{\"spec\":{\"nextStop\":\"$PAST\"}}" >/dev/null ||
    fail "ChaosPod $stopped's nextStop could not be changed"
  wait_for 60 "the new leader $new to reconcile the changed ChaosPods ($gone deleted, $born created, $stopped's Pod made again)" \
    converged "$stopped=$changed"
  step "ChaosPods changed while frozen ($gone deleted, $born created, $stopped's nextStop passed); $new reconciled them"

  # Thawed with work to do: every ChaosPod's nextStop passes again as it thaws, so both
  # leaders delete and make the Pods, the old one from what it saw before it froze.
  local kicked all
  mapfile -t cps < <(k -n "$CP_NS" get chaospods -o jsonpath='{range .items[*]}{.metadata.name}{"\n"}{end}')
  kicked=$(now)
  k -n "$CP_NS" patch chaospods "${cps[@]}" --type merge -p "{\"spec\":{\"nextStop\":\"$PAST\"}}" >/dev/null ||
    fail "setting the ChaosPods' nextStop in the past did not apply"
  thaw
  wait_for 60 "thawed $old to exit once it saw it lost the Lease" restarted_since "$old" "$before"
  sleep 3
  step "thawed as every ChaosPod's nextStop passed: $old exited (restarts $before -> $(restarts "$old")); $(holder) leads"
  # Under load a new leader can lose the Lease as well (client-go's renewal deadline):
  # its counts would mix three leaders, so the round counts nothing and the next one runs.
  if [[ $(holder) != "$new" ]]; then
    step "the Lease moved on again, from $new to $(holder): the counts would mix leaders, so this round counts nothing"
    return 0
  fi
  local verdict
  all=("${cps[@]/%/=$kicked}")
  wait_for 60 "every ChaosPod's Pod made again, and every ChaosPod and Pod as the leader makes them" converged "${all[@]}"
  verdict=$(converged "${all[@]}") || fail "$verdict"

  # The audit log: the new leader's first accepted write, then the old pod's writes.
  local writes first stale
  writes=$(writes_since "$mode_started")
  first=$(awk -F'\t' -v p="$new" -v t="$since" '$3 == p && $1 >= t && $6 ~ /^2/ {print $1; exit}' <<<"$writes")
  [[ -n $first ]] || fail "the audit log ($AUDIT_LOG) shows no accepted write of the new leader $new since $since (does the API server run with tests/controlplane/audit-policy.yaml as it is now? it reads it when it starts)"
  stale=$(classify "$writes" "$old" "$first")
  local s a r o
  s=$(grep -c . <<<"$stale" || true)
  a=$(grep -c $'^accepted\t' <<<"$stale" || true)
  r=$(grep -c $'^fenced\t' <<<"$stale" || true)
  o=$(grep -c $'^other\t' <<<"$stale" || true)
  step "the old pod's writes after the new leader's first ($first): $s sent, $a accepted, $r refused by the fence, $o refused otherwise"
  local class
  for class in accepted fenced other; do grep "^$class"$'\t' <<<"$stale" || true; done |
    awk -F'\t' '{printf "    %s %s %s -> %s %-8s %s%s\n", $2, $5, $6, $7, $1, ($8 == "-" ? "" : "token " $8 " "), $9}' | head -n 14

  # ChaosPods and Pods whose last write that changed them is one of those.
  local lo
  lo=$(classify "$writes" "" "" | awk -F'\t' '$1 == "accepted" && ($6 ~ /^pods\// || $6 ~ /^chaospods\//) {last[$6] = $4; at[$6] = $2}
    END {for (o in last) print o "\t" last[o] "\t" at[o]}' | awk -F'\t' -v p="$old" -v t="$first" '$2 == p && $3 > t' | wc -l)
  step "objects whose last change is one of those: $lo"

  sent[$mode]=$((${sent[$mode]:-0} + s))
  accepted[$mode]=$((${accepted[$mode]:-0} + a))
  refused[$mode]=$((${refused[$mode]:-0} + r))
  others[$mode]=$((${others[$mode]:-0} + o))
  last_old[$mode]=$((${last_old[$mode]:-0} + lo))
  rounds_of[$mode]=$round
  if [[ $mode == palisade ]]; then
    ((a == 0)) || fail "the API server accepted $a writes of the deposed leader $old after $new's first write (fenced by Lease $NS/$LEASE)"
    ((lo == 0)) || fail "$lo ChaosPods or Pods were last written by the deposed leader $old"
  fi
}

command -v jq >/dev/null || fail "jq is needed (it reads the audit log)"
[[ -w $FREEZER ]] || fail "the cgroup v1 freezer at $FREEZER is not writable (run as root, on the node)"
[[ -f $AUDIT_LOG ]] || fail "no audit log at $AUDIT_LOG (tests/controlplane/cluster.sh starts kube-apiserver with it: make cluster-down cluster)"
t0=$SECONDS
say "Set-up: the CRDs (palisade's, and the example operator's ChaosPod)"
# Deleted by an earlier run (as this one does at the end): it must be gone before it is made again.
if [[ -n $(k get crd "$CRD" -o jsonpath='{.metadata.deletionTimestamp}' 2>/dev/null) ]]; then
  k wait --for=delete "crd/$CRD" --timeout 60s >/dev/null 2>&1 || fail "CRD $CRD left by an earlier run is still being deleted after 60 s"
fi
k apply -f "$here/chaospod-crd.yaml" >/dev/null || fail "the ChaosPod CRD did not apply"
k apply --server-side --force-conflicts -f "$root/crds/palisade.dev.yaml" >/dev/null || fail "palisade's CRDs did not apply"
k wait --for condition=Established "crd/$CRD" --timeout 30s >/dev/null || fail "CRD $CRD not established in 30 s"
k create namespace "$SYSTEM_NS" >/dev/null
k annotate namespace "$SYSTEM_NS" --overwrite scheduler.alpha.kubernetes.io/node-selector= >/dev/null

for mode in $MODES; do
  NS=chaospod-$mode
  CP_NS=$NS-chaospods
  round=0
  setup_mode
  for round in $(seq 1 "$MAX_ROUNDS"); do
    freeze_round
    # A round in which the old leader sent nothing after the new one's first write (with
    # palisade: nothing the fence refused) proves nothing: freeze again (the new leader
    # is the next one frozen).
    if [[ $mode == palisade ]]; then ((${refused[$mode]} == 0)) || break; else ((${sent[$mode]} == 0)) || break; fi
  done
  if [[ $mode == palisade ]] && ((${refused[$mode]} == 0)); then
    fail "in $round rounds the fence refused no write of a deposed leader (${sent[$mode]} sent after the new leader's first, ${others[$mode]} refused otherwise): nothing is proven"
  fi
  remove_mode "$mode"
  NS=""
done

say "Stale writes of a deposed leader of controller-runtime's example operator (audit log; after the new leader's first write)"
printf '  %-10s %7s %6s %9s %8s %15s %20s\n' mode rounds sent accepted refused "refused other" "last change by old"
for mode in $MODES; do
  printf '  %-10s %7s %6s %9s %8s %15s %20s\n' "$mode" "${rounds_of[$mode]}" "${sent[$mode]}" "${accepted[$mode]}" \
    "${refused[$mode]}" "${others[$mode]}" "${last_old[$mode]}"
done
mode=""
say "Done in $((SECONDS - t0)) s."
