#!/usr/bin/env bash
# What readers can take from claims and write-backs: a 1,500-refund worker run
# (cmd/refundworker against the fake provider, on MariaDB) alone, then again
# while READERS readers each ask RPS expensive reads a second, up to
# CONCURRENCY at once — a ListJobs of the jobs in review whose reason prefix
# matches none of 20,001 of them, the most a filter costs the database (a
# client reading serially took ~40 ms each, 25 a second). Each reader has its own
# credential, so the coordinator's per-credential and per-coordinator shares
# (--max-reads-per-credential, --max-reads) apply as in production. Prints one
# line per run: the worker run's seconds, and per reader the reads answered
# and refused (RESOURCE_EXHAUSTED TOO_MANY_CALLS).
#
#   bench/readers.sh                          # this tree's binaries
#   BIN=/path/to/binaries bench/readers.sh    # another build's coordinator, refundworker, fakeprovider
#
# Environment: MYSQL_DSN (root@tcp(127.0.0.1:3306)/), MYSQL (the mysql client
# command, mysql -h127.0.0.1 -uroot), JOBS (1500), REVIEWS (20001), READERS
# (4), RPS (25), CONCURRENCY (4), COORDINATOR_FLAGS (extra flags). It needs Go,
# the server, and nothing else listening on the ports it picks.
set -euo pipefail
cd "$(dirname "$0")/.."

MYSQL_DSN="${MYSQL_DSN:-root@tcp(127.0.0.1:3306)/}"
MYSQL="${MYSQL:-mysql -h127.0.0.1 -uroot}"
JOBS="${JOBS:-1500}"
REVIEWS="${REVIEWS:-20001}"
READERS="${READERS:-4}"
CONCURRENCY="${CONCURRENCY:-4}"
RPS="${RPS:-25}"
read -r -a coordinator_flags <<<"${COORDINATOR_FLAGS:-}"
work="$(mktemp -d)"
pids=()
db="jfreaders_$$"
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  $MYSQL -e "DROP DATABASE IF EXISTS $db" || true
  rm -rf "$work"
}
trap cleanup EXIT

BIN="${BIN:-}"
if [ -z "$BIN" ]; then
  BIN="$work/bin"
  go build -o "$BIN/" ./cmd/coordinator ./cmd/refundworker ./cmd/fakeprovider
fi
# Built before anything runs, so that the readers are asking from their start
# (go tool would build it in each reader's start, which on a loaded machine
# can outlast the worker run it is meant to share with).
GOWORK=off go build -modfile=tools/ghz/go.mod -o "$work/ghz" github.com/bojand/ghz/cmd/ghz
ghz=("$work/ghz")

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
token() { head -c 18 /dev/urandom | base64 | tr '+/' '-_'; }
sha() { printf 'sha256:%s' "$(printf '%s' "$1" | sha256sum | cut -d' ' -f1)"; }

demo="$(token)"
{ printf 'demo producer,worker,reader %s\n' "$(sha "$demo")"
  for i in $(seq 1 "$READERS"); do
    t="$(token)"; echo "$t" >"$work/reader$i.token"
    printf 'reader%s reader %s\n' "$i" "$(sha "$t")"
  done; } >"$work/tokens"
echo "$demo" >"$work/demo.token"

$MYSQL -e "CREATE DATABASE $db"
dsn="${MYSQL_DSN%/}/$db"
"$BIN/coordinator" --mysql-dsn "$dsn" --migrate-only --log-level warn
# The reviews a person has to look at: each in review since now, with a reason.
$MYSQL "$db" -e "INSERT INTO refund_jobs (operation_key, order_id, payment_id, amount_minor, currency, provider,
  state, attempt, next_action, next_attempt_at, last_reason, created_at, updated_at)
SELECT CONCAT('review-', seq), CONCAT('order-', seq), CONCAT('pay-', seq), 1000, 'EUR', 'acme', 'manual_review', 1,
  'reconcile', UTC_TIMESTAMP(6), 'no record at the provider outside the key window', UTC_TIMESTAMP(6), UTC_TIMESTAMP(6)
FROM seq_1_to_$REVIEWS"

pay_port="$(port)"; grpc_port="$(port)"
"$BIN/fakeprovider" --listen "127.0.0.1:$pay_port" --log-level warn &
pids+=($!)
"$BIN/coordinator" --mysql-dsn "$dsn" --listen "127.0.0.1:$grpc_port" --tokens-file "$work/tokens" \
  --log-level warn "${coordinator_flags[@]}" &
pids+=($!)
for _ in $(seq 1 100); do
  (exec 3<>"/dev/tcp/127.0.0.1/$grpc_port") 2>/dev/null && break
  sleep 0.1
done

run() { # $1: key prefix; prints the worker run's seconds
  local start end
  start=$(date +%s.%N)
  "$BIN/refundworker" --coordinator "127.0.0.1:$grpc_port" --provider "http://127.0.0.1:$pay_port" \
    --token-file "$work/demo.token" --jobs "$JOBS" --key-prefix "$1" --log-level warn >"$work/$1.out" 2>&1
  end=$(date +%s.%N)
  python3 -c "print(f'{$end - $start:.1f}')"
}

alone="$(run alone)"
echo "worker run alone: ${alone}s ($(tail -1 "$work/alone.out"))"

data='{"state": "JOB_STATE_MANUAL_REVIEW", "reason_prefix": "zzz no reason starts so", "page_size": 100}'
for i in $(seq 1 "$READERS"); do
  "${ghz[@]}" --insecure --call jobfence.v1.Coordinator/ListJobs -d "$data" -c "$CONCURRENCY" --rps "$RPS" -z 10m \
    --metadata "{\"authorization\": \"Bearer $(cat "$work/reader$i.token")\"}" -O json \
    "127.0.0.1:$grpc_port" >"$work/reader$i.json" 2>/dev/null &
  pids+=($!)
  reader_pids+=($!)
done
sleep 2 # the readers at full flow before the worker starts
with="$(run withreaders)"
for p in "${reader_pids[@]}"; do kill -INT "$p" 2>/dev/null || true; done
for p in "${reader_pids[@]}"; do wait "$p" 2>/dev/null || true; done
echo "worker run with $READERS readers asking $RPS reads a second each: ${with}s ($(tail -1 "$work/withreaders.out"))"
for i in $(seq 1 "$READERS"); do
  python3 - "$work/reader$i.json" "$i" <<'PY'
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except Exception as e:
    print(f"reader {sys.argv[2]}: no summary ({e})"); sys.exit(0)
codes = r.get("statusCodeDistribution", {})
ok = codes.get("OK", 0)
refused = codes.get("ResourceExhausted", 0)
other = sum(v for k, v in codes.items() if k not in ("OK", "ResourceExhausted"))
print(f"reader {sys.argv[2]}: {ok} reads answered ({r.get('rps', 0):.0f}/s), {refused} refused, {other} other; "
      f"p50 {r.get('latencyDistribution', [{}]*3)[2].get('latency', 0)/1e6 if r.get('latencyDistribution') else 0:.1f} ms")
PY
done
python3 -c "print(f'slowdown: {$with / $alone:.2f}x')"
