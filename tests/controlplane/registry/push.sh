#!/usr/bin/env bash
# Pushes image archives (written by tests/controlplane/images/docker-archive.sh) to the
# cluster's registry by tag, and records the digest each push got next to its archive
# (DIR/NAME.tar -> DIR/NAME.digest, one line "sha256:..."): the tests pull by it.
#
#   push.sh ARCHIVE REF [ARCHIVE REF]...      e.g. target/images/palisade.tar 127.0.0.1:15005/palisade:0.2.0
#
# CRANE names the crane binary (the Makefile builds it). Fails, saying why, when no
# registry answers at REF's host: cluster.sh starts it (make cluster).
set -euo pipefail
CRANE=${CRANE:?CRANE must name the crane binary (make controlplane-bins builds it)}
if (($# == 0 || $# % 2 != 0)); then
  echo "usage: $0 ARCHIVE REF [ARCHIVE REF]..." >&2
  exit 2
fi
while (($#)); do
  archive=$1 ref=$2
  shift 2
  host=${ref%%/*}
  if ! curl -sf --max-time 3 -o /dev/null "http://$host/v2/"; then
    echo "push: no image registry answers at http://$host/v2/, cannot push $ref (make cluster starts it, on REGISTRY_PORT)" >&2
    exit 1
  fi
  # --insecure: plain HTTP, as the registry serves on loopback only.
  pushed=$("$CRANE" push --insecure "$archive" "$ref")
  digest=${pushed##*@}
  [[ $digest == sha256:* ]] || { echo "push: crane printed no digest for $ref: $pushed" >&2; exit 1; }
  echo "$digest" >"${archive%.tar}.digest"
  echo "pushed $ref ($digest)"
done
