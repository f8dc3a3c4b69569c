#!/usr/bin/env bash
# Checks examples/go-leader-redis on the local node (`make example-go-check`): installs
# the chart (a release of its own, for a fresh namespace), creates the fenced key's mark
# (the key's setup), deploys the example's 3 replicas, waits until the leader's entries
# flow into Redis, deletes the leader pod, and verifies from Redis that
#   - entries kept flowing, from another pod, under a higher fencing token;
#   - tokens never decrease along the list;
#   - each token belongs to one pod (one leader at a time: with non-decreasing tokens,
#     no two pods' entries interleave).
# Then it deletes the mark, as a Redis that lost it would, and verifies that no entry
# is admitted and no replica creates the mark again, restarts included.
# Exits non-zero with the reason on failure; removes its namespaces, release and keys.
#
# Needs: KUBECONFIG (make cluster, with its node), KUBECTL, HELM, redis-cli (REDIS_CLI)
# and Redis on 127.0.0.1:REDIS_PORT (make databases), and two images the node pulls from
# the cluster's registry (PALISADE_TEST_REGISTRY): the palisade image with the agent
# (PALISADE_IMAGE, pushed by `make image-local`) and the example's (GO_IMAGE, pushed by
# `make example-go-image`).
set -euo pipefail

: "${KUBECONFIG:?set KUBECONFIG}" "${KUBECTL:=kubectl}" "${HELM:=helm}" "${REDIS_CLI:=redis-cli}" "${REDIS_PORT:=16379}"
export KUBECONFIG
root=$(cd "$(dirname "$0")/../.." && pwd)
app_version=$(awk '$1 == "appVersion:" {gsub(/"/, "", $2); print $2}' "$root/charts/palisade/Chart.yaml")
registry=${PALISADE_TEST_REGISTRY:-127.0.0.1:15005}
PALISADE_IMAGE=${PALISADE_IMAGE:-$registry/palisade:$app_version}
GO_IMAGE=${GO_IMAGE:-$registry/go-leader-redis:1}
run=$(date +%s)
NS=go-leader-redis-$run
SYSTEM_NS=$NS-system
RELEASE=glr-$run # fullname glr-<run>-palisade: its own ClusterRoles and policies
KEY=$NS/go-leader-redis
LIST="palisade:{$KEY}:data:entries"
MARK="palisade:{$KEY}:token"

k() { "$KUBECTL" "$@"; }
r() { "$REDIS_CLI" -h 127.0.0.1 -p "$REDIS_PORT" --raw "$@"; }
say() { printf '\n\033[1m%s\033[0m\n' "$*"; }
step() { printf '  %s\n' "$*"; }
fail() {
  echo "go-leader-redis check: $*" >&2
  k -n "$NS" get pods -o wide >&2 2>/dev/null || true
  for p in $(k -n "$NS" get pods -o name 2>/dev/null); do
    echo "--- $p" >&2
    k -n "$NS" logs "$p" --all-containers --tail 15 >&2 2>/dev/null || true
  done
  exit 1
}
cleanup() {
  # The pods first: nothing writes once the keys are gone.
  k -n "$NS" delete deployment go-leader-redis --cascade=foreground --wait --timeout 60s >/dev/null 2>&1 || true
  r DEL "$LIST" "$MARK" >/dev/null 2>&1 || true
  "$HELM" uninstall "$RELEASE" -n "$SYSTEM_NS" --wait >/dev/null 2>&1 || true
  k delete namespace "$NS" "$SYSTEM_NS" --wait=false >/dev/null 2>&1 || true
}
trap cleanup EXIT
wait_for() { # seconds description command...
  local deadline=$((SECONDS + $1)) what=$2
  shift 2
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || fail "timed out waiting for $what"
    sleep 0.5
  done
}
entries() { r LRANGE "$LIST" 0 -1; }
count() { r LLEN "$LIST"; }
at_least() { (($(count) >= $1)); }
# The pod and token of the last entry ("<token> <pod> <seq>").
last() { r LINDEX "$LIST" -1; }
restarts() { # the app containers' restarts, all pods
  k -n "$NS" get pods -o jsonpath='{range .items[*]}{.status.containerStatuses[?(@.name=="app")].restartCount}{"\n"}{end}' |
    awk '{n += $1} END {print n + 0}'
}
restarted_since() { (($(restarts) > $1)); }
new_leader_writes() { # old-pod count: at least count entries from another pod
  entries | awk -v old="$1" -v n="$2" '$2 != old {c++} END {exit !(c >= n)}'
}

r PING >/dev/null || fail "no Redis on 127.0.0.1:$REDIS_PORT (make databases)"

say "1. The controller: the chart as release $RELEASE, for namespace $NS"
for ns in "$SYSTEM_NS" "$NS"; do
  k create namespace "$ns" >/dev/null
  k annotate namespace "$ns" --overwrite scheduler.alpha.kubernetes.io/node-selector= >/dev/null
done
# The CRDs outlive releases and other releases use them: applied here, not owned by this
# release (crds.enabled=false, docs/operating.md "CRDs"). Always: `make image-local` and
# `make example-go-image` push the same tags again with every build.
k apply --server-side --force-conflicts -f "$root/crds/palisade.dev.yaml" >/dev/null
"$HELM" upgrade --install "$RELEASE" "$root/charts/palisade" -n "$SYSTEM_NS" --set crds.enabled=false \
  --set image.repository="${PALISADE_IMAGE%:*}" --set image.tag="${PALISADE_IMAGE##*:}" \
  --set image.pullPolicy=Always --set controller.watchNamespace="$NS" \
  --set "policies.namespaceSelector.matchLabels.kubernetes\.io/metadata\.name=$NS" \
  --wait --timeout 120s >/dev/null || fail "the chart did not install"
step "controller ready in $SYSTEM_NS"

say "2. The example: the fenced key's mark, then 3 replicas, each with the agent as a native sidecar"
# The key's setup, once (what `palisade fence --store redis://... --create --key KEY`
# does): the example never creates the mark, and refuses to start without it.
r SET "$MARK" "" NX >/dev/null
step "fence mark $MARK created"
sed -e "s|name: palisade-client|name: $RELEASE-palisade-client|" \
  -e "s|image: ghcr.io/palisade-dev/palisade:.*|image: $PALISADE_IMAGE|" \
  -e "s|image: .*/go-leader-redis:.*|image: $GO_IMAGE|" \
  -e "s|imagePullPolicy: IfNotPresent|imagePullPolicy: Always|" \
  "$root/examples/go-leader-redis/deployment.yaml" | k -n "$NS" apply -f - >/dev/null
k -n "$NS" rollout status deployment/go-leader-redis --timeout 120s >/dev/null || fail "the deployment did not become ready"
wait_for 90 "the leader's entries in $LIST" at_least 10
read -r token leader _ <<<"$(last)"
step "leader: pod $leader, fencing token $token; $(count) entries"

say "3. Delete the leader pod"
k -n "$NS" delete pod "$leader" --wait=false >/dev/null
deleted_at=$SECONDS
wait_for 60 "entries from a new leader" new_leader_writes "$leader" 10
read -r new_token new_leader _ <<<"$(last)"
step "new leader: pod $new_leader, fencing token $new_token; its 10th entry $((SECONDS - deleted_at))s after the deletion"

say "4. Verify the list in Redis"
# Line by line: tokens never decrease, each token has one pod, each pod's entries under
# a token are numbered upwards; at least two tokens (the handover).
verdict=$(entries | awk '
  NF != 3 { print "malformed entry " NR ": " $0; bad = 1; exit 1 }
  NR > 1 && $1 < prev { print "token " $1 " (entry " NR ", pod " $2 ") after token " prev; bad = 1; exit 1 }
  ($1 in pod) && pod[$1] != $2 { print "token " $1 " used by pods " pod[$1] " and " $2 " (entry " NR ")"; bad = 1; exit 1 }
  ($1 in seq) && $3 <= seq[$1] { print "token " $1 ": entry " $3 " after " seq[$1] " (entry " NR ")"; bad = 1; exit 1 }
  { if (!($1 in pod)) tokens++; pod[$1] = $2; seq[$1] = $3; prev = $1 }
  END { if (bad) exit 1; if (tokens < 2) { print "only " tokens " token(s): no handover"; bad = 1; exit 1 } print NR " entries, " tokens " tokens" }
') || fail "$verdict"
step "$verdict"
((new_token > token)) || fail "the new leader's token $new_token is not higher than $token"
[[ $new_leader != "$leader" ]] || fail "the deleted pod $leader still writes"
step "tokens never decrease; one pod per token; pod $new_leader took over from $leader with $new_token > $token"

say "5. Redis loses the mark"
before=$(restarts)
r DEL "$MARK" >/dev/null
admitted=$(count)
step "mark deleted after $admitted entries"
# The leader's next write is refused (NOMARK): it stops leading and exits; restarted,
# it refuses to start without the mark.
wait_for 90 "a replica to restart after the mark was lost" restarted_since "$before"
sleep 2
(($(r EXISTS "$MARK") == 0)) || fail "the mark $MARK was created again after Redis lost it"
(($(count) == admitted)) || fail "$(($(count) - admitted)) entries admitted without the mark"
step "no entry admitted, the mark not created again ($(restarts) restarts)"
say "Done: leadership moved on, fenced, one leader at a time; a lost mark stops the writers."
