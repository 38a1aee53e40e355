#!/usr/bin/env bash
# EnqueueRefund load: every request carries its own operation_key (the run's
# time, ghz's request number and a random UUID), so each creates a new ready job
# of provider $PROVIDER. The service is found by server reflection.
set -euo pipefail
source "$(dirname "$0")/common.sh"

run=$(date -u +%Y%m%dT%H%M%SZ)
data='{"operation_key": "ghz-'"$run"'-{{.RequestNumber}}-{{newUUID}}",
  "order_id": "ghz-order-{{.RequestNumber}}", "payment_id": "ghz-pay-{{.UUID}}",
  "amount_minor": 1000, "currency": "EUR", "provider": "'"$PROVIDER"'"}'

ghz --insecure --call jobfence.v1.Coordinator/EnqueueRefund -d "$data" \
  -c "$CONCURRENCY" --connections "$CONNECTIONS" "${amount[@]}" "$@" "$addr"
