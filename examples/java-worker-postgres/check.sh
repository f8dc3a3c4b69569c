#!/usr/bin/env bash
# examples/java-worker-postgres, end to end on the local node (make example-java-check):
# the check of ../worker-postgres-check.sh (what it checks, and what it needs: IMAGE and
# WORKER_IMAGE are pushed by make image-local example-java-image), with this example's
# names; and, from the deleted holder's log, that its worker stopped on SIGTERM (the
# shutdown hook).
set -euo pipefail

EXAMPLE=java-worker-postgres
NS_PREFIX=java-worker RELEASE_PREFIX=palisade-jw DB_PREFIX=java_worker
LEASE=java-worker DEPLOYMENT=java-worker TABLE=java_worker_rows
CHECK_STOPPED_LOG=yes
# deployment.yaml's DATABASE_URL is a JDBC URL:
# jdbc:postgresql://127.0.0.1:15432/java_worker?user=postgres&sslmode=disable
database_url_sed() { printf '%s' "s|//127.0.0.1:15432/java_worker?user=postgres|//$PG_HOST:$PG_PORT/$DB?user=$PG_USER|"; }

. "$(dirname "$0")/../worker-postgres-check.sh"
