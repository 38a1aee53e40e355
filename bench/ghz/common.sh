# Shared by the ghz recipes: argument checks and the pinned ghz (v0.121.0,
# tools/ghz/go.mod). Sourced, not run.

usage() {
  cat >&2 <<USAGE
usage: BENCH_TARGET_IS_DEDICATED=yes $0 HOST:PORT [extra ghz flags, e.g. -O json]

environment:
  TOTAL=2000         requests to send (ghz -n)
  DURATION=          send for this long instead, e.g. 30s (ghz -z; it overrides TOTAL)
  CONCURRENCY=16     concurrent request workers (ghz -c)
  CONNECTIONS=4      gRPC connections shared by the workers (ghz --connections)
  PROVIDER=ghz_bench provider of the jobs enqueued and claimed
USAGE
  exit 2
}

[ $# -ge 1 ] && [ "${1#-}" = "$1" ] || usage
if [ "${BENCH_TARGET_IS_DEDICATED:-}" != "yes" ]; then
  echo "refusing: jobs enqueued here are real refund jobs for every worker of that deployment." >&2
  echo "Run only against a coordinator on its own database, then set BENCH_TARGET_IS_DEDICATED=yes." >&2
  exit 2
fi

addr=$1
shift
TOTAL=${TOTAL:-2000}
CONCURRENCY=${CONCURRENCY:-16}
CONNECTIONS=${CONNECTIONS:-4}
PROVIDER=${PROVIDER:-ghz_bench}
# In ghz v0.121.0 -x silently overrides -n; -z is the duration flag to use.
if [ -n "${DURATION:-}" ]; then
  amount=(-z "$DURATION")
else
  amount=(-n "$TOTAL")
fi

# go tool needs the module root as its working directory.
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
ghz() { GOWORK=off go tool -modfile=tools/ghz/go.mod ghz "$@"; }
