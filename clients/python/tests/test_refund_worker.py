"""The example refund worker (examples/refund_worker.py) as a process, against
a real coordinator on MariaDB and the fake provider over HTTP: refunds made
once under their operation key (R1, R2), a cut reply reconciled instead of
resent blindly (T3, R14), and a clean drain on SIGTERM; the jobs come on the
worker stream, or with --no-stream from Claim calls."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any, Optional

from jobfence import JobState

from harness import Coordinator, Proc, admin, eventually, start_provider

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "refund_worker.py"


def test_refund_worker_refunds_once_and_drains_on_sigterm(coord: Coordinator) -> None:
    provider, url = start_provider()
    worker = None
    try:
        # T3: the provider refunds and cuts the reply of the first two sends.
        admin(url, "POST", "/v1/_admin/faults", {"cut_reply": True, "times": 2})
        c = coord.client()
        keys = [f"pyex-{i}" for i in range(12)]
        for i, k in enumerate(keys):
            admin(url, "POST", "/v1/_admin/payments", {"payment_id": f"pay-{k}", "amount_minor": 2**53 + i,
                                                         "currency": "EUR"})
            c.enqueue_refund(operation_key=k, order_id=f"order-{k}", payment_id=f"pay-{k}", amount_minor=2**53 + i,
                             currency="EUR", provider="pyex")
        worker = Proc("py-worker", [sys.executable, str(EXAMPLE), "--provider", url, "--provider-name", "pyex",
                                    "--worker-id", "py-ex-1", "--lease", "5s", "--provider-timeout", "2s",
                                    "--unknown-delay", "200ms", "--claim-wait", "2s", "--log-level", "debug"],
                      env={"REFUNDWORKER_COORDINATOR": coord.address, "REFUNDWORKER_CONCURRENCY": "3"})
        started = worker.wait_for(lambda r: r.get("msg") == "refund-worker started", "its start")
        assert started["stream"] is True
        claims = coord.rpc_count("Claim")

        def all_done() -> bool:
            return all(c.get_job(operation_key=k).job.state is JobState.SUCCEEDED for k in keys)

        eventually(all_done, 60, "every job succeeded")
        assert worker.stop(30) == 0, worker.tail()
        stopped = worker.wait_for(lambda r: r.get("msg") == "refund-worker stopped", "its stop record")
        assert stopped["drained"] is True and stopped["stats"]["completed"] == len(keys), stopped
        assert coord.rpc_count("Claim") == claims, "a Claim call: the jobs come on the worker stream"
        oracle = admin(url, "GET", "/v1/_oracle")
        assert oracle["double_refunds"] == 0 and len(oracle["refunds"]) == len(keys)
        for op in oracle["operations"]:
            # R1, R2: the operation key is the Idempotency-Key and the reference, never with the attempt.
            assert op["idempotency_keys"] == op["merchant_references"] and op["refunds"] == 1, op
        for k in keys:
            d = c.get_job(operation_key=k)
            assert [e.kind for e in d.events].count("completed") == 1
        # Every line about a job names its grant, never its token (R25).
        for r in worker.records:
            if "job_id" in r:
                assert len(str(r.get("grant"))) == 12, r
                assert not any("token" in key for key in r), r
        # The cut replies really happened, and were reconciled, not resent as new refunds.
        assert oracle["stats"]["cut_replies"] == 2 and oracle["stats"]["refunds_created"] == len(keys), oracle["stats"]
    finally:
        if worker is not None:
            worker.stop(5)
        provider.stop(5)


def load_example() -> Any:
    spec = importlib.util.spec_from_file_location("refund_worker_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_refund_worker_receipt_spool_flag_R28(coord: Coordinator, tmp_path: Path) -> None:
    ex = load_example()
    assert ex.parse_config([], {}).receipt_spool == ""
    assert ex.parse_config([], {"REFUNDWORKER_RECEIPT_SPOOL": "/var/spool/w.jsonl"}).receipt_spool == "/var/spool/w.jsonl"
    assert ex.parse_config(["--receipt-spool", "off"], {"REFUNDWORKER_RECEIPT_SPOOL": "/elsewhere"}).receipt_spool == "off"

    # Two workers on one spool: the second is refused at its start (R28).
    spool = tmp_path / "w.receipts.jsonl"
    args = [sys.executable, str(EXAMPLE), "--coordinator", coord.address, "--provider-name", "nobody",
            "--worker-id", "py-spool-1", "--receipt-spool", str(spool)]
    first = Proc("py-worker-1", args)
    second: Optional[Proc] = None
    try:
        started = first.wait_for(lambda r: r.get("msg") == "refund-worker started", "its start")
        assert started["receipt_spool"] == str(spool)
        second = Proc("py-worker-2", args)
        refused = second.wait_for(lambda r: r.get("msg") == "receipt spool", "its refusal")
        assert refused["level"] == "error" and "in use by another worker" in refused["error"], refused
        assert second.p.wait(10) == 1
    finally:
        if second is not None:
            second.stop(5)
        assert first.stop(30) == 0, first.tail()
    assert not spool.exists(), "an empty spool was left behind"


def test_refund_worker_no_stream_flag_claims_with_claim_calls(coord: Coordinator) -> None:
    ex = load_example()
    assert ex.parse_config([], {}).no_stream is False
    assert ex.parse_config([], {"REFUNDWORKER_NO_STREAM": "true"}).no_stream is True
    assert ex.parse_config(["--no-stream"], {}).no_stream is True
    assert ex.parse_config(["--no-stream=false"], {"REFUNDWORKER_NO_STREAM": "1"}).no_stream is False

    c = coord.client()
    key = "pyex-unary"
    c.enqueue_refund(operation_key=key, order_id=f"order-{key}", payment_id=f"pay-{key}", amount_minor=100,
                     currency="EUR", provider="pyex-unary")
    provider, url = start_provider()
    worker = None
    try:
        admin(url, "POST", "/v1/_admin/payments", {"payment_id": f"pay-{key}", "amount_minor": 100, "currency": "EUR"})
        works = coord.rpc_count("Work")
        worker = Proc("py-worker-unary", [sys.executable, str(EXAMPLE), "--coordinator", coord.address,
                                          "--provider", url, "--provider-name", "pyex-unary", "--worker-id",
                                          "py-ex-unary", "--claim-wait", "1s", "--receipt-spool", "off"],
                      env={"REFUNDWORKER_NO_STREAM": "true"})
        started = worker.wait_for(lambda r: r.get("msg") == "refund-worker started", "its start")
        assert started["stream"] is False
        eventually(lambda: c.get_job(operation_key=key).job.state is JobState.SUCCEEDED, 30, "the job succeeded")
        assert worker.stop(30) == 0, worker.tail()
        assert coord.rpc_count("Work") == works, "a worker stream was opened"
    finally:
        if worker is not None:
            worker.stop(5)
        provider.stop(5)
