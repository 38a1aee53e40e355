#!/usr/bin/env bash
# Claim load: each request claims at most one job of provider $PROVIDER under a
# 60 s lease and never writes it back. Enqueue at least TOTAL jobs first
# (enqueue.sh); claims beyond them answer empty lists, and after 60 s the
# unanswered jobs become takeovers. The service is found by server reflection.
set -euo pipefail
source "$(dirname "$0")/common.sh"

data='{"worker_id": "ghz-{{.WorkerID}}", "max_jobs": 1, "provider": "'"$PROVIDER"'",
  "lease_duration": "60s"}'

ghz --insecure --call jobfence.v1.Coordinator/Claim -d "$data" \
  -c "$CONCURRENCY" --connections "$CONNECTIONS" "${amount[@]}" "$@" "$addr"
