#!/usr/bin/env bash
# The fencing story with real processes (`make demo`):
#   two workers contend for one Lease with `palisade lock` and write to a fenced
#   store; the holder sends a write that the network delays, then is paused
#   (SIGSTOP) past its lease; the other is granted a higher token and writes; the
#   delayed write arrives with the old token and is rejected; the paused holder
#   resumes and `palisade lock` ends its command, the lease being lost.
#
# Needs: KUBECONFIG (the local control plane), PALISADE (the binary), KUBECTL.
# Exits 0 only when the stale write was rejected and the store kept the new token.
set -euo pipefail

: "${KUBECONFIG:?set KUBECONFIG}" "${PALISADE:?set PALISADE to the palisade binary}" "${KUBECTL:=kubectl}"
export KUBECONFIG
NS=${DEMO_NAMESPACE:-palisade-demo}
WORK=${DEMO_DIR:-target/demo}
LEASE=ledger
DURATION=3s

rm -rf "$WORK"
mkdir -p "$WORK"
STORE=$WORK/store
pids=()
cleanup() {
  # Out of the job table first: bash reports a killed job ("Killed") after the verdict.
  disown -a
  for p in "${pids[@]}"; do
    # SIGKILL: the workers ignore SIGTERM, and nothing may outlive the demo.
    for g in "$p" $(pgrep -P "$p"); do kill -KILL -- "-$g" 2>/dev/null || true; done
  done
  clear_namespace --wait=false
}
# The demo's objects go, its namespace stays: the bare plane of `make demo` runs no
# namespace controller, so a deleted namespace would never finish terminating.
clear_namespace() {
  "$KUBECTL" -n "$NS" delete leases.palisade.dev,leaseclaims.palisade.dev --all "$@" >/dev/null 2>&1 || true
}
trap cleanup EXIT

say() { printf '\n\033[1m%s\033[0m\n' "$*"; }
step() { printf '  %s\n' "$*"; }
wait_for() { # seconds description command...
  local deadline=$((SECONDS + $1)) what=$2
  shift 2
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || { echo "demo: timed out waiting for $what" >&2; exit 1; }
    sleep 0.1
  done
}
lease_field() { "$KUBECTL" -n "$NS" get leases.palisade.dev "$LEASE" -o "jsonpath={$1}" 2>/dev/null; }
journal_has() { grep -q "$1" "$STORE/journal.jsonl" 2>/dev/null; }

say "1. Set-up: CRDs, a namespace, the controller"
"$PALISADE" crds | "$KUBECTL" apply --server-side --field-manager palisade-demo -f - >/dev/null
"$KUBECTL" wait --for condition=Established crd/leases.palisade.dev crd/leaseclaims.palisade.dev --timeout 30s >/dev/null
"$KUBECTL" get namespace "$NS" >/dev/null 2>&1 || "$KUBECTL" create namespace "$NS" >/dev/null
clear_namespace --wait=true
setsid "$PALISADE" controller --namespace "$NS" --leader-elect=false --admin-addr 127.0.0.1:0 \
  >"$WORK/controller.log" 2>&1 &
pids+=($!)
step "controller running (log: $WORK/controller.log)"

# A worker: holds the lease, writes once at once, then sends a second write over a
# slow network (the demo plays the network: it holds the request, with its token,
# until it chooses to deliver it) and works on.
cat >"$WORK/worker.sh" <<'EOF'
#!/usr/bin/env bash
# SIGTERM is ignored, and so by the fence it runs (ignored signals survive exec):
# the write in progress completes even though palisade lock asks it to stop.
trap '' TERM
write() {
  if out=$("$PALISADE" fence --store "$STORE" --key "$PALISADE_LEASE" --token "$PALISADE_FENCING_TOKEN" --payload "$1" 2>&1); then
    echo "$PALISADE_HOLDER: write '$1' with token $PALISADE_FENCING_TOKEN -> ACCEPTED"
  else
    echo "$PALISADE_HOLDER: write '$1' with token $PALISADE_FENCING_TOKEN -> REJECTED ($out)"
  fi
}
send() { # the request, whole: token and payload
  printf '%s\n%s\n' "$PALISADE_FENCING_TOKEN" "$1" >"$NETWORK/$PALISADE_HOLDER.tmp"
  mv "$NETWORK/$PALISADE_HOLDER.tmp" "$NETWORK/$PALISADE_HOLDER"
  echo "$PALISADE_HOLDER: sent '$1' with token $PALISADE_FENCING_TOKEN"
}
echo "$PALISADE_HOLDER: I hold lease $PALISADE_LEASE with fencing token $PALISADE_FENCING_TOKEN"
write "$PALISADE_HOLDER first write"
send "$PALISADE_HOLDER second write"
sleep 30
EOF
chmod +x "$WORK/worker.sh"
NETWORK=$WORK/network
mkdir -p "$NETWORK"
export STORE PALISADE NETWORK
"$PALISADE" fence --store "$STORE" --create >/dev/null

say "2. worker-a takes the lease ($DURATION) and writes"
setsid "$PALISADE" lock -n "$NS" --duration "$DURATION" --identity worker-a "$LEASE" -- "$WORK/worker.sh" \
  >"$WORK/worker-a.log" 2>&1 &
A=$!
pids+=("$A")
wait_for 30 "worker-a's first write" journal_has "worker-a first write"
TOKEN_A=$(lease_field .status.fencingToken)
sed 's/^/  | /' "$WORK/worker-a.log"

wait_for 30 "worker-a's second write to be sent" test -e "$NETWORK/worker-a"
step "worker-a sent its second write with token $TOKEN_A; the network holds it up"

say "3. worker-a stalls: SIGSTOP (a long GC pause), for longer than its $DURATION lease"
# palisade lock (which renews) and the command (its own process group) both freeze.
A_CMD=$(ps -o pgid= -p "$(pgrep -P "$A" | head -n 1)" | tr -d ' ')
kill -STOP -- "$A" "-$A_CMD"
step "worker-a and its renewals are frozen; it still believes it holds token $TOKEN_A"

say "4. worker-b asks for the same lease"
setsid "$PALISADE" lock -n "$NS" --duration "$DURATION" --identity worker-b "$LEASE" -- "$WORK/worker.sh" \
  >"$WORK/worker-b.log" 2>&1 &
pids+=($!)
wait_for 30 "worker-b's grant" bash -c "[[ \$($KUBECTL -n $NS get leases.palisade.dev $LEASE -o jsonpath='{.status.holder.identity}') == worker-b ]]"
TOKEN_B=$(lease_field .status.fencingToken)
step "the controller saw no renewal from worker-a for $DURATION: grant expired"
step "worker-b is granted the lease with token $TOKEN_B (higher than $TOKEN_A)"
wait_for 30 "worker-b's first write" journal_has "worker-b first write"
sed 's/^/  | /' "$WORK/worker-b.log"
"$KUBECTL" -n "$NS" get leases.palisade.dev "$LEASE" | sed 's/^/  /'

say "5. The network delivers worker-a's delayed write, with token $TOKEN_A"
# No lock service can stop a write already on its way; the fence at the store does.
{ read -r token; read -r payload; } <"$NETWORK/worker-a"
if out=$("$PALISADE" fence --store "$STORE" --key "$LEASE" --token "$token" --payload "$payload" 2>&1); then
  echo "network: worker-a's write '$payload' with token $token -> ACCEPTED" >"$WORK/network.log"
else
  echo "network: worker-a's write '$payload' with token $token -> REJECTED ($out)" >"$WORK/network.log"
fi
sed 's/^/  | /' "$WORK/network.log"

say "6. worker-a wakes up (SIGCONT): its lease is gone, so palisade lock ends the command"
kill -CONT -- "-$A_CMD" "$A"
set +e
wait "$A"
A_EXIT=$?
set -e
sed 's/^/  | /' "$WORK/worker-a.log" | tail -n +4
step "palisade lock for worker-a exited with $A_EXIT (the lease was lost while the command was stopped)"

say "7. What the fenced store accepted"
sed 's/^/  | /' "$STORE/journal.jsonl"
HIGHEST=$("$PALISADE" fence --store "$STORE" --show | grep -o "\"$LEASE\": *[0-9]*" | grep -o '[0-9]*$')

if grep -q "worker-a second write.*REJECTED (write rejected: stale" "$WORK/network.log" && ! journal_has "worker-a second write" \
  && [[ $HIGHEST == "$TOKEN_B" ]] && ((TOKEN_B > TOKEN_A)); then
  echo
  echo "verdict: SAFE - worker-a's stale write (token $TOKEN_A) was rejected; the store's highest token is worker-b's $TOKEN_B."
else
  echo
  echo "verdict: UNSAFE - the stale write was not rejected as expected (highest $HIGHEST, a=$TOKEN_A, b=$TOKEN_B)" >&2
  exit 1
fi
