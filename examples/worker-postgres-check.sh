# The end-to-end check of a fenced PostgreSQL worker example on the local node, sourced
# by examples/python-worker-postgres/check.sh and examples/java-worker-postgres/check.sh,
# which set what differs between them (below). It installs the chart into a namespace of
# its own, the fence and the table into a database of its own, deploys the 3 workers,
# waits for rows, deletes the holder pod, and checks from PostgreSQL that
#   - rows kept coming under a new, higher token, from another pod;
#   - no row carries a token lower than an earlier row's;
#   - each transaction's rows share one token, and every transaction is whole;
# and, with CHECK_STOPPED_LOG=yes, from the deleted holder's log that its worker stopped
# on SIGTERM. Removes its release, namespace and database on every way out. Exits non-zero
# with the reason on failure.
#
# Set by the example's check.sh before sourcing this file:
#   EXAMPLE      the example's directory name (messages, the worker image's name)
#   NS_PREFIX RELEASE_PREFIX DB_PREFIX
#                the namespace, release and database names, before a random suffix
#   LEASE DEPLOYMENT TABLE
#                as in the example's deployment.yaml and schema.sql
#   database_url_sed
#                a function printing the sed expression that points deployment.yaml's
#                database URL at PG_HOST:PG_PORT/DB (a function: DB is named here)
#   CHECK_STOPPED_LOG
#                yes: follow the holder's worker log, which must end with " worker: stopped"
# Sourced, not run: $0 is the example's check.sh, whose directory holds deployment.yaml
# and schema.sql.
#
# Needs: KUBECONFIG (make cluster, with its node), KUBECTL, HELM, IMAGE (the palisade
# image, with `palisade agent`) and WORKER_IMAGE, which the node pulls from the cluster's
# registry (make image-local and the example's image target push them), PostgreSQL on
# PG_HOST:PG_PORT (make databases) and psql.
set -euo pipefail

: "${EXAMPLE:?}" "${NS_PREFIX:?}" "${RELEASE_PREFIX:?}" "${DB_PREFIX:?}" "${LEASE:?}" \
  "${DEPLOYMENT:?}" "${TABLE:?}" "${CHECK_STOPPED_LOG:=no}"
: "${KUBECONFIG:?set KUBECONFIG}" "${KUBECTL:=kubectl}" "${HELM:=helm}" "${IMAGE:?set IMAGE (the palisade image)}"
export KUBECONFIG
PG_HOST=${PG_HOST:-127.0.0.1} PG_PORT=${PG_PORT:-15432} PG_USER=${PG_USER:-postgres}
WORKER_IMAGE=${WORKER_IMAGE:-${PALISADE_TEST_REGISTRY:-127.0.0.1:15005}/$EXAMPLE:1}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
suffix=$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')
NS=$NS_PREFIX-$suffix
RELEASE=$RELEASE_PREFIX-$suffix # contains "palisade": the chart's full name is the release name
DB=${DB_PREFIX}_$suffix
BATCH_ROWS=3
helm_home=$(mktemp -d)
export HELM_CONFIG_HOME=$helm_home/config HELM_CACHE_HOME=$helm_home/cache HELM_DATA_HOME=$helm_home/data

k() { "$KUBECTL" "$@"; }
pg() { psql -X -q -At -v ON_ERROR_STOP=1 -h "$PG_HOST" -p "$PG_PORT" -U "$PG_USER" "$@"; }
q() { pg -d "$DB" -c "$1"; }
say() { printf '%s\n' "$*"; }

cleanup() {
  trap - EXIT
  "$HELM" uninstall "$RELEASE" -n "$NS" --wait --timeout 60s >/dev/null 2>&1 || true
  k delete namespace "$NS" --wait=false >/dev/null 2>&1 || true
  pg -d postgres -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" >/dev/null 2>&1 || true
  rm -rf "$helm_home"
}
trap cleanup EXIT

fail() {
  echo "$EXAMPLE: $*" >&2
  {
    k -n "$NS" get pods -o wide || true
    for pod in $(k -n "$NS" get pods -o name 2>/dev/null); do
      echo "--- $pod"
      k -n "$NS" logs "$pod" --all-containers --tail 20 || true
    done
  } >&2 2>&1
  exit 1
}

wait_for() { # seconds description command...
  local deadline=$((SECONDS + $1)) what=$2
  shift 2
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || fail "timed out after $((SECONDS - deadline + $1)) s waiting for $what"
    sleep 0.5
  done
}

say "1. Database $DB: the fence (sql/palisade-fence.sql) and the worker's table"
pg -d postgres -c "CREATE DATABASE $DB"
pg -d "$DB" -f "$root/sql/palisade-fence.sql" >/dev/null
pg -d "$DB" -f "$here/schema.sql"

say "2. Namespace $NS and the chart (release $RELEASE, image $IMAGE)"
k create namespace "$NS" >/dev/null
# hostNetwork (the node's PostgreSQL is on 127.0.0.1) needs Pod Security "privileged".
k label namespace "$NS" pod-security.kubernetes.io/enforce=privileged >/dev/null
k annotate namespace "$NS" scheduler.alpha.kubernetes.io/node-selector= >/dev/null
# The CRDs outlive releases and other releases use them: applied here, not owned by this
# release (crds.enabled=false, docs/operating.md "CRDs"). Always: `make image-local` and
# the example's image target push the same tags again with every build.
k apply --server-side --force-conflicts -f "$root/crds/palisade.dev.yaml" >/dev/null
"$HELM" install "$RELEASE" "$root/charts/palisade" -n "$NS" --set crds.enabled=false \
  --set image.repository="${IMAGE%:*}" --set image.tag="${IMAGE##*:}" \
  --set image.pullPolicy=Always --set controller.watchNamespace="$NS" \
  --set-json "policies.namespaceSelector={\"matchLabels\":{\"kubernetes.io/metadata.name\":\"$NS\"}}" \
  --wait --timeout 120s >/dev/null

say "3. The workers: 3 pods, each with palisade agent as a native sidecar"
sed -e "s|image: ghcr.io/palisade-dev/palisade:[^ ]*|image: $IMAGE|" \
  -e "s|image: .*/$EXAMPLE:.*|image: $WORKER_IMAGE|" \
  -e "s|imagePullPolicy: IfNotPresent|imagePullPolicy: Always|" \
  -e "s|name: palisade-client|name: $RELEASE-client|" \
  -e "$(database_url_sed)" \
  "$here/deployment.yaml" | k -n "$NS" apply -f - >/dev/null
k -n "$NS" rollout status "deployment/$DEPLOYMENT" --timeout 180s >/dev/null ||
  fail "the deployment did not become ready"

rows() { q "SELECT count(*) FROM $TABLE"; }
rows_flow() { (($(rows) >= 30)); }
wait_for 90 "rows in $TABLE" rows_flow
holder=$(q "SELECT writer FROM $TABLE ORDER BY id DESC LIMIT 1")
token=$(q "SELECT max(token) FROM $TABLE")
say "   rows flow: $(rows) rows; holder $holder writes with token $token"

say "4. Delete the holder pod $holder"
if [[ $CHECK_STOPPED_LOG == yes ]]; then
  # Its worker's log to the end: it must stop on SIGTERM, releasing the Lease itself.
  timeout 60 "$KUBECTL" -n "$NS" logs -f "$holder" -c worker >"$helm_home/holder.log" 2>&1 &
  holder_logs=$!
  wait_for 20 "the holder's log" grep -q ' worker: granted ' "$helm_home/holder.log"
fi
k -n "$NS" delete pod "$holder" --wait=false >/dev/null
taken_over() { (($(q "SELECT count(*) FROM $TABLE WHERE token > $token AND writer <> '$holder'") >= 10)); }
wait_for 60 "rows under a higher token from another pod" taken_over
new_holder=$(q "SELECT writer FROM $TABLE WHERE token > $token ORDER BY id LIMIT 1")
new_token=$(q "SELECT min(token) FROM $TABLE WHERE token > $token")
gap=$(q "SELECT round(extract(epoch FROM (SELECT min(written_at) FROM $TABLE WHERE token > $token)
                                     - (SELECT max(written_at) FROM $TABLE WHERE token <= $token))::numeric, 2)")
say "   $new_holder took over with token $new_token ($gap s after the last row of token $token)"

if [[ $CHECK_STOPPED_LOG == yes ]]; then
  wait "$holder_logs" || true
  grep -q ' worker: stopped$' "$helm_home/holder.log" ||
    fail "the deleted holder's worker did not log that it stopped: $(tail -5 "$helm_home/holder.log")"
  say "   the deleted holder's worker logged: $(grep ' worker: ' "$helm_home/holder.log" | tail -2 | cut -d' ' -f3- | paste -sd ';')"
fi

say "5. Check the rows"
(( new_token > token )) || fail "the new token $new_token is not higher than $token"
lower=$(q "SELECT count(*) FROM (
  SELECT token, max(token) OVER (ORDER BY id ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS before
  FROM $TABLE) r WHERE token < before")
(( lower == 0 )) || fail "$lower rows carry a token lower than an earlier row's"
mixed=$(q "SELECT count(*) FROM (SELECT txn FROM $TABLE GROUP BY txn
  HAVING count(DISTINCT token) > 1 OR count(*) <> $BATCH_ROWS) t")
(( mixed == 0 )) || fail "$mixed transactions have rows of more than one token, or not $BATCH_ROWS rows"
mark=$(q "SELECT token FROM palisade.marks WHERE key = '$NS/$LEASE'")
top=$(q "SELECT max(token) FROM $TABLE")
[[ -n $mark ]] && (( mark >= top )) || fail "the fence's mark for $NS/$LEASE (${mark:-none}) is below the highest row token $top"
say "   $(q "SELECT count(*) || ' rows in ' || count(DISTINCT txn) || ' transactions under tokens '
  || (SELECT string_agg(t::text, ', ' ORDER BY t) FROM (SELECT DISTINCT token AS t FROM $TABLE) d)
  FROM $TABLE")"
say "   no row has a token lower than an earlier row's; each transaction: $BATCH_ROWS rows, one token; fence mark $mark"
say "Done: the worker's writes moved to a new, higher token when its holder pod was deleted."
