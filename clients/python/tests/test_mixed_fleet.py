"""The mixed fleet: Go (cmd/refundworker), Node (clients/node's example
refund-worker) and Python (examples/refund_worker.py) workers, two of each,
work the same 600 refunds at once with 2 s leases, against a real
coordinator on MariaDB and the fake provider over HTTP. The provider cuts
replies, hangs past the lease, pends, lags and fails a burst of requests;
one worker of each language is frozen (SIGSTOP: a GC pause, a stopped
container) while it holds jobs, so that they are taken over and its late
writes hit the fence. In the end every job succeeded exactly once, the
provider refunded every operation key exactly once (double_refunds=0), and
the ledger agrees (R1, R2, R8, R9, R14, R15, R25, R27, T1, T3).

The workers take their jobs from the worker stream, but for py-1, which
claims with Claim calls (--no-stream), so that both kinds of Python worker
share the fleet; the frozen ones hold streams.

Nothing here asserts on timing: waits are generous and event-driven; the
numbers (takeovers, stale rejections, jobs per language) are printed.

The Node worker is clients/node/dist/examples/refund-worker.js (built by the
Node tests, or here with `npm run build` when clients/node has its
node_modules), or JOBFENCE_NODE_WORKER_JS.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from jobfence import Client, JobState, NextAction

from harness import REPO, Proc, admin, go_binary, start_coordinator

JOBS = 600
PROVIDER = "acme"
LEASE = "2s"  # short, so that takeovers happen (R17)
PY_WORKER = Path(__file__).resolve().parents[1] / "examples" / "refund_worker.py"

# Applied one after the other, each once the previous one is used up. The
# hangs outlast the 2 s lease; go-1 waits up to 4 s for the provider, so a
# hang that lands there turns into a late write; the others cut the call at
# 1.5 s: an unknown outcome, reconciled.
FAULT_PHASES: list[tuple[str, dict[str, Any]]] = [
    ("T3: refund made, reply cut", {"cut_reply": True, "times": 4}),
    ("hang 3 s after the refund is made (longer than the lease)", {"hang_after": 3, "times": 3}),
    ("503 burst", {"error_burst": 6}),
    ("hang 3 s before anything is done (longer than the lease)", {"hang_before": 3, "times": 3}),
    ("R4: refunds pending for 1 s", {"pending": 1, "times": 8}),
    ("R14: reply cut and lookups lag 2 s behind", {"cut_reply": True, "lookup_lag": 2, "times": 3}),
]


def node_worker_js() -> str:
    if os.environ.get("JOBFENCE_NODE_WORKER_JS"):
        return os.environ["JOBFENCE_NODE_WORKER_JS"]
    node = REPO / "clients" / "node"
    js = node / "dist" / "examples" / "refund-worker.js"
    if not js.exists():
        assert (node / "node_modules").exists(), "the fleet needs the Node worker: run npm ci in clients/node"
        subprocess.run(["npm", "run", "build"], cwd=node, check=True, timeout=300, stdout=subprocess.DEVNULL)
    return str(js)


def flags(lang: str, coordinator: str, provider: str, wid: str, provider_timeout: str, spool_dir: Path) -> list[str]:
    f = ["--coordinator", coordinator, "--provider", provider, "--provider-name", PROVIDER, "--worker-id", wid,
         "--concurrency", "6", "--lease", LEASE, "--provider-timeout", provider_timeout, "--unknown-delay", "300ms",
         "--pending-delay", "500ms", "--claim-wait", "5s", "--drain-timeout", "20s", "--log-level", "debug"]
    # The receipt spools stay with the test, not in the user's cache (R28).
    f += ["--receipt-spool", str(spool_dir / f"{wid}.receipts.jsonl")]
    if lang == "go":
        f += ["--log-format", "json"]
    return f


def list_all(c: Client, state: JobState) -> list[Any]:
    out: list[Any] = []
    token = ""
    while True:
        jobs, token = c.list_jobs(state=state, provider=PROVIDER, page_size=500, page_token=token)
        out += jobs
        if not token:
            return out


def test_mixed_fleet_go_node_python_600_refunds_each_succeeded_once(tmp_path: Path) -> None:
    coord = start_coordinator()
    procs: list[Proc] = []
    try:
        _run_fleet(coord, procs, tmp_path)
    finally:
        for p in procs:
            p.stop(5)
        coord.stop()


def _run_fleet(coord: Any, procs: list[Proc], spool_dir: Path) -> None:
    client: Client = coord.client()
    # Every refund takes 200 ms at the provider, as a real one's round trip
    # does: a worker frozen while it holds jobs then holds some mid-call,
    # acknowledged, which only a takeover ends. With answers at once, a freeze
    # caught jobs already written back or grants not yet acknowledged (handed
    # back), and on a quiet machine the fleet finished before any freeze cost
    # a job.
    provider = Proc("fakeprovider", [go_binary("fakeprovider", "JOBFENCE_FAKEPROVIDER_BIN"), "--listen", "127.0.0.1:0",
                                     "--log-format", "json", "--shutdown-timeout", "1s", "--latency", "200ms"])
    procs.append(provider)
    rec = provider.wait_for(lambda r: r.get("msg") == "fakeprovider serving", '"fakeprovider serving"')
    url = f"http://{rec['listen']}"
    admin(url, "POST", "/v1/_admin/faults", FAULT_PHASES[0][1])

    refundworker = go_binary("refundworker", "JOBFENCE_REFUNDWORKER_BIN")
    node_js = node_worker_js()
    workers: list[tuple[str, str, Proc]] = []

    def start(lang: str, wid: str, provider_timeout: str, by_env: bool = False, extra: tuple[str, ...] = ()) -> None:
        f = flags(lang, coord.address, url, wid, provider_timeout, spool_dir) + list(extra)
        cmd = {"go": [refundworker], "node": ["node", node_js], "py": [sys.executable, str(PY_WORKER)]}[lang]
        env: dict[str, str] = {}
        if by_env:  # configured by REFUNDWORKER_* variables only
            env = {"REFUNDWORKER_" + f[i][2:].upper().replace("-", "_"): f[i + 1] for i in range(0, len(f), 2)}
            f = []
        p = Proc(wid, cmd + f, env)
        procs.append(p)
        workers.append((lang, wid, p))

    start("go", "go-1", "4s")
    start("go", "go-2", "1500ms")
    start("node", "node-1", "1500ms")
    start("node", "node-2", "1500ms", by_env=True)
    start("py", "py-1", "1500ms", extra=("--no-stream", "true"))
    start("py", "py-2", "1500ms", by_env=True)
    started_msg = {"go": "refundworker started", "node": "refund-worker started", "py": "refund-worker started"}
    for lang, _, p in workers:
        p.wait_for(lambda r, m=started_msg[lang]: r.get("msg") == m, "its start", 60)
    t0 = time.monotonic()
    done = threading.Event()
    errors: list[BaseException] = []

    phases_used: list[str] = []

    def faults() -> None:
        for i, (name, _) in enumerate(FAULT_PHASES):
            while True:
                now = admin(url, "GET", "/v1/_admin/faults")
                if not any(now.get(k) for k in ("cut_reply", "hang_after", "hang_before", "pending", "lookup_lag",
                                                "error_burst", "fail")):
                    phases_used.append(f"{name} @{time.monotonic() - t0:.1f}s")
                    break
                if done.is_set():
                    return
                time.sleep(0.05)
            if i + 1 == len(FAULT_PHASES) or done.is_set():
                return
            admin(url, "POST", "/v1/_admin/faults", FAULT_PHASES[i + 1][1])

    # Freeze one worker of each language while it holds jobs: its leases
    # lapse and the others take the jobs over (R6, R8: expiry only opens the
    # competition; the takeover's commit ends the frozen worker's grant). Then
    # it runs on: every write it still makes for those jobs is stale (T1), and
    # a refund it still sends carries the same operation key (R1). It is
    # frozen while it holds jobs, again until a freeze costs it a job: a grant
    # it had not yet acknowledged comes back within half a lease (the worker
    # stream hands it back); those it had acknowledged are taken over.
    rounds: dict[str, list[tuple[int, int, float]]] = {}

    def freeze(wid: str, p: Proc) -> None:
        rounds[wid] = []
        try:
            for rnd in range(100):
                if done.is_set():
                    return
                if rnd > 0:
                    time.sleep(0.2)
                held = []
                while not done.is_set():
                    held = [j for j in list_all(client, JobState.RUNNING) if j.worker_id == wid]
                    if held:
                        break
                    time.sleep(0.05)
                if not held:
                    return
                p.signal(signal.SIGSTOP)
                frozen_at = time.monotonic()
                taken = 0
                end = time.monotonic() + 60
                for j in held:
                    while True:
                        now = client.get_job(j.id).job
                        if now.attempt > j.attempt or now.state is not JobState.RUNNING:
                            taken += now.attempt > j.attempt
                            break
                        assert time.monotonic() < end, f"job {j.id} held by the frozen {wid} was not taken over"
                        time.sleep(0.1)
                p.signal(signal.SIGCONT)
                rounds[wid].append((len(held), taken, round(time.monotonic() - frozen_at, 1)))
                if taken:
                    return
        except BaseException as e:  # noqa: BLE001
            errors.append(e)
        finally:
            p.signal(signal.SIGCONT)

    threads = [threading.Thread(target=faults, daemon=True)]
    time.sleep(0.5)
    for _, wid, p in workers:
        if wid.endswith("-2"):
            threads.append(threading.Thread(target=freeze, args=(wid, p), daemon=True))
    for t in threads:
        t.start()

    keys = [f"mix-{i + 1}" for i in range(JOBS)]

    def amount(key: str) -> int:
        return 1000 + int(key[4:])

    def enqueue(key: str) -> int:
        admin(url, "POST", "/v1/_admin/payments", {"payment_id": f"pay-{key}", "amount_minor": amount(key),
                                                     "currency": "EUR"})
        job, _ = client.enqueue_refund(operation_key=key, order_id=f"order-{key}", payment_id=f"pay-{key}",
                                       amount_minor=amount(key), currency="EUR", provider=PROVIDER)
        return job.id

    with ThreadPoolExecutor(16) as pool:
        ids = dict(zip(keys, pool.map(enqueue, keys)))
    print(f"enqueued {JOBS} refunds in {time.monotonic() - t0:.1f}s")

    try:
        end = time.monotonic() + 150
        while True:
            ready, _ = client.list_jobs(state=JobState.READY, provider=PROVIDER, page_size=1)
            running, _ = client.list_jobs(state=JobState.RUNNING, provider=PROVIDER, page_size=1)
            if not ready and not running:
                break
            assert time.monotonic() < end, "jobs not final after 150 s\n" + "\n".join(p.tail(15) for _, _, p in workers)
            time.sleep(0.25)
    finally:
        done.set()
    for t in threads:
        t.join(70)
    assert not errors, errors
    admin(url, "DELETE", "/v1/_admin/faults")
    print(f"all {JOBS} jobs final {time.monotonic() - t0:.1f}s after the fleet started")
    t_stop = time.monotonic()

    # SIGTERM: every worker drains and exits cleanly (all at once).
    with ThreadPoolExecutor(len(workers)) as pool:
        exits = list(pool.map(lambda w: w[2].stop(30), workers))
    for (lang, wid, p), code in zip(workers, exits):
        assert code == 0, f"{wid} exit\n{p.tail()}"
    print(f"the fleet drained and exited in {time.monotonic() - t_stop:.1f}s")
    stats: dict[str, dict[str, Any]] = {}
    stopped_msg = {"go": "refundworker stopped", "node": "refund-worker stopped", "py": "refund-worker stopped"}
    for lang, wid, p in workers:
        rec = next((r for r in p.records if r.get("msg") == stopped_msg[lang]), None)
        assert rec is not None, f"{wid} logged no stop record\n{p.tail()}"
        st = rec["stats"]
        stats[wid] = {m[0]: int(m[1]) for m in re.findall(r"(\w+):(\d+)", st)} if lang == "go" else dict(st)

    # The coordinator's view: every job succeeded, with exactly one completion.
    with ThreadPoolExecutor(8) as pool:
        details = dict(zip(keys, pool.map(lambda k: client.get_job(operation_key=k), keys)))
    bad = [f"{k}: {d.job.state.value} ({d.job.last_reason}) " + " ".join(f"{e.kind}@{e.attempt}:{e.worker_id}" for e in d.events)
           for k, d in details.items() if d.job.state is not JobState.SUCCEEDED]
    assert bad == [], "every job SUCCEEDED"
    completed_by: dict[str, int] = {}
    takeovers = reconcile_claims = observations = stale_observations = 0
    for k, d in details.items():
        job = d.job
        assert job.id == ids[k]
        completed = [e for e in d.events if e.kind == "completed"]
        assert len(completed) == 1, f"{k}: exactly one completed event"
        assert completed[0].attempt == job.attempt, f"{k}: completed under the current attempt (R9)"
        assert completed[0].provider_refund_id == job.provider_refund_id
        grants = [e for e in d.events if e.kind in ("claimed", "taken_over")]
        assert [e.attempt for e in grants] == list(range(1, len(grants) + 1)), f"{k}: attempts 1, 2, 3… (R2)"
        assert len(grants) == job.attempt
        takeovers += sum(e.kind == "taken_over" for e in d.events)
        reconcile_claims += sum(e.next_action is not NextAction.REFUND for e in grants)
        lang = completed[0].worker_id.split("-")[0]
        completed_by[lang] = completed_by.get(lang, 0) + 1
        for o in d.observations:
            observations += 1
            assert o.reported_attempt <= job.attempt
            if o.provider_refund_id:
                assert o.provider_refund_id == job.provider_refund_id, f"{k}: observed refund id (R15)"
            stale_observations += o.reported_attempt < job.attempt
    for lang in ("go", "node", "py"):
        assert completed_by.get(lang, 0) >= 1, f"{lang} workers completed jobs: {completed_by}"
    assert sum(completed_by.values()) == JOBS, completed_by

    # The provider's truth: one refund per operation key, under that key and
    # reference only (R1, R2), nobody refunded twice.
    oracle = admin(url, "GET", "/v1/_oracle")
    assert oracle["double_refunds"] == 0, [o for o in oracle["operations"] if o["duplicate"]]
    assert oracle["duplicate_operations"] == 0 and oracle["over_refunded_payments"] == 0
    assert len(oracle["refunds"]) == JOBS, "one refund created per job"
    by_ref = {o["merchant_references"][0]: o for o in oracle["operations"]}
    for k in keys:
        op = by_ref[k]
        assert op["merchant_references"] == [k] and op["idempotency_keys"] == [k], f"{k}: the key, never the attempt (R2)"
        assert op["refund_ids"] == [details[k].job.provider_refund_id] and op["refunds"] == 1
    for r in oracle["refunds"]:
        assert r["status"] == "succeeded" and r["amount_minor"] == amount(r["merchant_reference"])

    # The ledger agrees: one row per job, with its refund, amount and attempt (R10).
    row = coord.sql(
        "SELECT COUNT(*), COUNT(DISTINCT l.operation_key), "
        "SUM(j.state = 'succeeded' AND j.provider_refund_id = l.provider_refund_id AND j.operation_key = l.operation_key "
        "AND j.amount_minor = l.amount_minor AND j.attempt = l.attempt) "
        "FROM refund_ledger l JOIN refund_jobs j ON j.id = l.job_id"
    ).split()
    assert [int(x) for x in row] == [JOBS, JOBS, JOBS], "ledger rows, distinct keys, rows agreeing with their job"

    # R25: every worker's line about a job names a grant the history recorded
    # for that job and attempt, never a token; every write-back a worker was
    # told had landed is in the history under that very grant.
    hist = [line.split("\t") for line in coord.sql(
        "SELECT job_id, attempt, kind, LOWER(HEX(LEFT(lease_token_hash, 6))) FROM refund_job_events").strip().splitlines()]
    grants_made = {(j, a, g) for j, a, k, g in hist if k in ("claimed", "taken_over")}
    writes_made = {(j, a, k, g) for j, a, k, g in hist}
    ack = {"complete": "completed", "reschedule": "rescheduled", "escalate": "escalated",
           "job completed": "completed", "job rescheduled": "rescheduled", "job escalated to manual review": "escalated"}
    acked: dict[str, int] = {}
    for lang, wid, p in workers:
        for r in p.records:
            if "job_id" not in r or "attempt" not in r:
                continue
            g = str(r.get("grant"))
            assert re.fullmatch(r"[0-9a-f]{12}", g), f"{wid}: a job line without its grant: {r}"
            assert not any("token" in key.lower() for key in r), f"{wid}: a token field in {r}"
            j, a = str(r["job_id"]), str(r["attempt"])
            assert (j, a, g) in grants_made, f"{wid}: a grant the history never recorded: {r}"
            kind = ack.get(str(r["decision"]) if r.get("msg") == "job written" else str(r.get("msg")))
            if kind is not None:
                assert (j, a, kind, g) in writes_made, f"{wid}: an accepted write-back not in the history: {r}"
                acked[lang] = acked.get(lang, 0) + 1
    assert all(acked.get(lang, 0) > 0 for lang in ("go", "node", "py")), acked

    # The hazards were really there: each frozen worker lost jobs to takeovers.
    for wid, rs in rounds.items():
        assert any(taken for _, taken, _ in rs), f"jobs of the frozen {wid} were taken over: {rs}"
    assert takeovers >= 3

    def stat(wid: str, *names: str) -> int:
        return sum(int(stats[wid].get(n, 0)) for n in names)

    print(f"completed by language: {completed_by}; per worker: "
          + " ".join(f"{w}={stat(w, 'Completed', 'completed')}" for _, w, _ in workers))
    print(f"takeovers {takeovers}; claims that reconciled first {reconcile_claims}; stale write-backs rejected: "
          + " ".join(f"{w}={stat(w, 'StaleRejected', 'stale_rejected')}" for _, w, _ in workers)
          + f"; observations on file {observations} ({stale_observations} from stale attempts)")
    print(f"frozen: {rounds}; fault phases used {len(phases_used)}/{len(FAULT_PHASES)}: {phases_used}")
    print(f"provider: {oracle['stats']}")
