#!/usr/bin/env bash
# make demo's builds: cargo's build of palisade runs beside the Go builds of the bare
# control plane (which make runs one at a time: a kube link takes ~2 GiB), then a table of
# what each build took the first time. The Go rules keep that next to their binary
# (<binary>.seconds); cargo's is kept in target/. So a newcomer learns what the first run
# waited for, and a later run shows the same table with "cached".
#
#   build.sh BINARY...   the Go binaries (make builds them with `make demo-bins`)
# Needs: MAKE. Prints the table on stdout.
set -euo pipefail
started=$(date +%s)
mkdir -p target
cargo_log=target/demo-cargo.log
cargo_seconds=target/debug/palisade.seconds

(
  t0=$(date +%s)
  cargo build --locked --bin palisade >"$cargo_log" 2>&1
  if grep -q 'Compiling palisade ' "$cargo_log"; then echo $(($(date +%s) - t0)) >"$cargo_seconds"; fi
) &
cargo_pid=$!
# The cargo build is this script's child: it must not outlive a failed Go build.
trap 'kill "$cargo_pid" 2>/dev/null || true' EXIT
"${MAKE:-make}" --no-print-directory demo-bins
if ! wait "$cargo_pid"; then
  echo "make demo: cargo build failed; its output ($cargo_log):" >&2
  tail -n 40 "$cargo_log" >&2
  exit 1
fi
trap - EXIT

row() { # name seconds-file
  local took="unrecorded" when="reused"
  if [[ -f $2 ]]; then
    took="$(cat "$2") s"
    (($(stat -c %Y "$2") >= started)) && when="built now"
  fi
  printf '  %-30s %12s  %s\n' "$1" "$took" "$when"
}
echo
echo "make demo: what it builds (the first run builds each part; later runs reuse it)"
printf '  %-30s %12s  %s\n' "part" "first build" "this run"
for bin in "$@"; do row "$(basename "$bin") (Go)" "$bin.seconds"; done
row "palisade (cargo, beside them)" "$cargo_seconds"
echo "  this run's builds: $(($(date +%s) - started)) s"
