#!/usr/bin/env bash
# examples/python-worker-postgres, end to end on the local node (make example-python-check):
# the check of ../worker-postgres-check.sh (what it checks, and what it needs: IMAGE and
# WORKER_IMAGE are pushed by make image-local example-python-image), with this example's
# names. The Python worker logs no line of its own when SIGTERM ends it, so its holder's
# log is not checked.
set -euo pipefail

EXAMPLE=python-worker-postgres
NS_PREFIX=py-worker RELEASE_PREFIX=palisade-pyw DB_PREFIX=python_worker
LEASE=python-worker DEPLOYMENT=python-worker TABLE=worker_rows
CHECK_STOPPED_LOG=no
# deployment.yaml's DATABASE_URL is a libpq URL: postgresql://postgres@127.0.0.1:15432/python_worker
database_url_sed() { printf '%s' "s|@127.0.0.1:15432/python_worker|@$PG_HOST:$PG_PORT/$DB|"; }

. "$(dirname "$0")/../worker-postgres-check.sh"
