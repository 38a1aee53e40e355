#!/usr/bin/env bash
# jobfence against River in one sitting: jobfence's own bench for its drain
# (scenario C, batch 100, 16 workers) and its latency (scenario E), then the
# River harness (bench/river) burning a backlog and at the same steady rates,
# one after the other, never at once. Prints both sets of summary lines and a
# table of ratios jobfence/River computed from them.
#
#   bench/compare.sh                              # the full comparison
#   BACKLOG=5000 RIVER_JOBS=10000 DURATION=5s bench/compare.sh   # a small check
#
# Environment (defaults for a machine with MariaDB and PostgreSQL on it):
#   MYSQL_DSN   jobfence's server             root@tcp(127.0.0.1:3306)/
#   PG_DSN      River's server                host=/var/run/postgresql dbname=postgres
#   BACKLOG     jobs of jobfence's drain      50000
#   BATCH       max_jobs of jobfence's drain  100
#   RIVER_JOBS  jobs of River's burn          100000
#   RATES       steady rates, jobs/s          100,1000
#   DURATION    producer run per rate         20s
#   AT_ONCE     jobs worked at once at the steady rates, by either: River's
#               MaxWorkers; jobfence's workers of at most 100 slots each  1000
#               (32, scenario E's own default, lets a busy machine's
#               slower round trips cap jobfence's fleet below 1,000 jobs/s:
#               docs/BENCHMARKS.md, run 19)
#   OUT         where binaries and summaries go (a new temporary folder)
#   JOBFENCE_FLAGS, RIVER_FLAGS   further flags for either bench, space-separated
#   TABLE_ONLY  when set, measure nothing: print the table of the run in OUT again
# The River harness stands in for PostgreSQL's autovacuum while it measures
# (every second, by autovacuum's rules; bench/river/README.md says why: on a
# server with autovacuum off, River's fetch otherwise keeps a plan made for
# an empty table). RIVER_FLAGS='--autovacuum-naptime 0' turns that off.
# Run it from anywhere in the repository; it needs Go and both servers.
set -euo pipefail
cd "$(dirname "$0")/.."

MYSQL_DSN="${MYSQL_DSN:-root@tcp(127.0.0.1:3306)/}"
PG_DSN="${PG_DSN:-host=/var/run/postgresql dbname=postgres}"
BACKLOG="${BACKLOG:-50000}"
BATCH="${BATCH:-100}"
RIVER_JOBS="${RIVER_JOBS:-100000}"
RATES="${RATES:-100,1000}"
DURATION="${DURATION:-20s}"
AT_ONCE="${AT_ONCE:-1000}"
at_once_workers=$(((AT_ONCE + 99) / 100)) # a Claim takes at most 100 jobs
OUT="${OUT:-$(mktemp -d)}"
read -r -a jobfence_flags <<<"${JOBFENCE_FLAGS:-}"
read -r -a river_flags <<<"${RIVER_FLAGS:-}"
mkdir -p "$OUT"

say() { printf '\n== %s\n' "$*" >&2; }

if [ -z "${TABLE_ONLY:-}" ]; then
# Both binaries are built before anything is measured, so that no compiler
# shares the machine with a measurement.
say "building the jobfence bench and the River harness into $OUT"
go build -o "$OUT/jobfence-bench" ./cmd/jobfence-bench
(cd bench/river && GOWORK=off go build -o "$OUT/river-bench" .)

say "jobfence: scenarios C (batch $BATCH, 16 workers, $BACKLOG jobs) and E ($RATES jobs/s for $DURATION)"
# --results keeps this run's summary out of bench/results/.
"$OUT/jobfence-bench" --mysql-dsn "$MYSQL_DSN" --scenarios ce --history 0 \
  --backlog "$BACKLOG" --batch "$BATCH" --workers 16 \
  --latency-rates "$RATES" --latency-duration "$DURATION" --latency-workers "$at_once_workers" --latency-slots $((AT_ONCE / at_once_workers)) \
  --results "$OUT/jobfence-results" ${jobfence_flags[@]+"${jobfence_flags[@]}"} >"$OUT/jobfence.txt"

say "River: burn $RIVER_JOBS jobs, steady $RATES jobs/s for $DURATION"
"$OUT/river-bench" --pg-dsn "$PG_DSN" --jobs "$RIVER_JOBS" --rates "$RATES" --duration "$DURATION" --workers "$AT_ONCE" \
  ${river_flags[@]+"${river_flags[@]}"} >"$OUT/river.txt"
fi

# val FILE PATTERN KEY: the value of KEY on the first line of FILE matching PATTERN.
val() {
  awk -v pat="$2" -v key="$3" '$0 ~ pat {
    for (i = 1; i <= NF; i++) if (index($i, key "=") == 1) { print substr($i, length(key) + 2); exit }
  }' "$1"
}
# sum A B: A+B, empty when either is not a number.
sum() { awk -v a="$1" -v b="$2" 'BEGIN { if (a ~ /^[0-9.]+$/ && b ~ /^[0-9.]+$/) printf "%.1f", a + b }'; }
# row LABEL JOBFENCE RIVER: one line of the table with the ratio.
row() {
  awk -v l="$1" -v a="$2" -v b="$3" 'BEGIN {
    r = (a ~ /^[0-9.]+$/ && b ~ /^[0-9.]+$/ && b + 0 != 0) ? sprintf("%.2f", a / b) : "n/a"
    printf "%-58s %12s %12s %8s\n", l, (a == "" ? "n/a" : a), (b == "" ? "n/a" : b), r
  }'
}

jf="$OUT/jobfence.txt" rv="$OUT/river.txt"
printf '\n== jobfence (cmd/jobfence-bench)\n'
cat "$jf"
printf '\n== River (bench/river)\n'
cat "$rv"

printf '\n== jobfence / River (jobs/s: above 1 is jobfence faster; ms and CPU: below 1 is jobfence cheaper)\n'
printf '%-58s %12s %12s %8s\n' "" jobfence River ratio
e2e="^e2e .* batch=$BATCH( |\$)" coord="^coordinator batch=$BATCH( |\$)"
row "drain jobs/s (C through gRPC | burn)" "$(val "$jf" "$e2e" jobs_per_s)" "$(val "$rv" '^river burn ' jobs_per_s)"
jf_db="$(val "$jf" "$coord" db_cpu_us_per_job)"
jf_client="$(sum "$(val "$jf" "$coord" cpu_us_per_job)" "$(val "$jf" "$coord" bench_cpu_us_per_job)")"
row "drain database CPU us/job (MariaDB | PostgreSQL)" "$jf_db" "$(val "$rv" '^river burn ' cpu_us_per_job_pg)"
row "drain client-side CPU us/job (coordinator+workers | River)" "$jf_client" "$(val "$rv" '^river burn ' cpu_us_per_job_client)"
row "drain all processes CPU us/job" "$(sum "$jf_db" "$jf_client")" "$(val "$rv" '^river burn ' cpu_us_per_job_total)"
stream="^e2e_stream .* credits=$BATCH( |\$)"
row "drain jobs/s (C through worker streams | burn)" "$(val "$jf" "$stream" jobs_per_s)" "$(val "$rv" '^river burn ' jobs_per_s)"
st_db="$(val "$jf" "$stream" db_cpu_us_per_job)"
st_client="$(sum "$(val "$jf" "$stream" cpu_us_per_job)" "$(val "$jf" "$stream" bench_cpu_us_per_job)")"
row "stream drain all processes CPU us/job" "$(sum "$st_db" "$st_client")" "$(val "$rv" '^river burn ' cpu_us_per_job_total)"
IFS=, read -r -a rates <<<"$RATES"
for r in "${rates[@]}"; do
  st="^river steady rate=$r "
  for kind in latency latency_stream; do
    lat="^$kind rate=$r "
    for p in p50 p95 p99; do
      row "$r jobs/s ($kind): enqueue->completed $p ms" "$(val "$jf" "$lat" "${p}_ms")" "$(val "$rv" "$st" "${p}_ms")"
    done
    row "$r jobs/s ($kind): database CPU us/job" "$(val "$jf" "$lat" db_cpu_us_per_job)" "$(val "$rv" "$st" cpu_us_per_job_pg)"
    jf_all="$(sum "$(sum "$(val "$jf" "$lat" db_cpu_us_per_job)" "$(val "$jf" "$lat" coordinator_cpu_us_per_job)")" \
      "$(val "$jf" "$lat" bench_cpu_us_per_job)")"
    row "$r jobs/s ($kind): all processes CPU us/job" "$jf_all" "$(val "$rv" "$st" cpu_us_per_job_total)"
  done
done
for r in "${rates[@]}"; do
  st="^river steady rate=$r " h1="$(val "$rv" "$st" p99_first_half_ms)" h2="$(val "$rv" "$st" p99_second_half_ms)"
  # A queue that falls behind the rate grows through the run: the second
  # half's p99 far above the first's (twice, and by more than a second).
  verdict="$(awk -v a="$h1" -v b="$h2" 'BEGIN {
    if (a !~ /^[0-9.]+$/ || b !~ /^[0-9.]+$/) print "not known"
    else if (b > 2 * a && b - a > 1000) print "far higher: River fell behind the rate"
    else print "River kept up"
  }')"
  printf '%s\n' "River at $r jobs/s: p99 ${h1:-n/a} ms for the jobs enqueued in the run's first half," \
    "  ${h2:-n/a} ms for the second half's ($verdict)"
done
printf '%s\n' "jobfence's all processes: the database, the coordinator and the bench (its producer and workers);" \
  "River's: PostgreSQL and its one process (client, workers and producer)." \
  "Summaries and binaries: $OUT"
