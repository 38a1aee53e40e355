"""The Client against a real coordinator on MariaDB: the write-back fence
(T1, R9, R25), replays (R21), every typed error (R24), int64 beyond 2**53."""

from __future__ import annotations

import hashlib
import time

import pytest

from jobfence import (
    Client,
    GrantTooOldError,
    InvalidArgumentError,
    JobNotInReviewError,
    JobNotRunningError,
    JobState,
    LeaseToken,
    NextAction,
    NotFoundError,
    OperationKeyConflictError,
    Outcome,
    PermissionDeniedError,
    RetryPolicy,
    StaleAttemptError,
    UnauthenticatedError,
    UnavailableError,
)

from harness import Coordinator, kinds, refund, start_coordinator


def claim_one(c: Client, worker: str, provider: str, lease: float = 30):
    jobs = c.claim(worker, 1, provider=provider, lease=lease)
    assert len(jobs) == 1, f"{worker} claimed {jobs}"
    return jobs[0]


def test_enqueue_claim_complete(coord: Coordinator) -> None:
    c = coord.client()
    r = refund()
    job, created = c.enqueue_refund(**r)
    assert created and job.state is JobState.READY and job.attempt == 0
    again, created2 = c.enqueue_refund(**r)  # R1: the same refund is the same job
    assert not created2 and again.id == job.id
    cj = claim_one(c, "py-a", r["provider"])
    assert (cj.job.id, cj.attempt, cj.next_action, cj.takeover) == (job.id, 1, NextAction.REFUND, False)
    assert len(cj.lease_token.reveal()) == 22 and cj.claimed_at is not None and cj.lease_seconds() == 30
    wr = c.complete(cj.job.id, cj.attempt, cj.lease_token, "re_e2e_1")
    assert not wr.replayed and wr.job.state is JobState.SUCCEEDED and wr.job.provider_refund_id == "re_e2e_1"
    d = c.get_job(job.id)
    assert kinds(d) == ["enqueued@0", "claimed@1", "completed@1"]
    # R25: the history keeps the grant's hash; the SDK's fingerprint is its first 6 bytes.
    fp = coord.sql(f"SELECT LOWER(HEX(LEFT(lease_token_hash, 6))) FROM refund_job_events "
                   f"WHERE job_id = {job.id} AND kind = 'claimed'").strip()
    assert fp == cj.lease_token.fingerprint() == hashlib.sha256(cj.lease_token.reveal().encode()).hexdigest()[:12]


def test_T1_zombie_writes_late_and_is_fenced_R8_R9_R25(coord: Coordinator) -> None:
    # A (this process) claims, pauses after its provider call; its lease is
    # expired in test data (never by moving a clock); B, another client, takes
    # over; A's complete, reschedule and escalate are each refused and change
    # nothing, before and after B completes.
    a, b = coord.client(), coord.client()
    r = refund()
    job, _ = a.enqueue_refund(**r)
    ca = claim_one(a, "py-zombie", r["provider"])
    coord.expire_lease(job.id)
    cb = claim_one(b, "py-b", r["provider"])
    assert (cb.attempt, cb.takeover, cb.next_action) == (2, True, NextAction.RECONCILE)  # R6

    def zombie_writes() -> None:
        for write in (
            lambda: a.complete(job.id, ca.attempt, ca.lease_token, "re_zombie"),
            lambda: a.reschedule(job.id, ca.attempt, ca.lease_token, next_action=NextAction.REFUND, reason="retry"),
            lambda: a.escalate(job.id, ca.attempt, ca.lease_token, "zombie gives up"),
            # R25: the current attempt is not enough without its token.
            lambda: a.complete(job.id, cb.attempt, LeaseToken("A" * 22), "re_zombie"),
            lambda: a.complete(job.id, cb.attempt, "", "re_zombie"),
        ):
            with pytest.raises(StaleAttemptError) as info:
                write()
            assert info.value.current_attempt == 2

    zombie_writes()
    mid = a.get_job(job.id).job
    assert (mid.state, mid.attempt, mid.worker_id, mid.provider_refund_id) == (JobState.RUNNING, 2, "py-b", "")
    b.complete(job.id, cb.attempt, cb.lease_token, "re_b")
    zombie_writes()
    d = a.get_job(job.id)
    assert (d.job.state, d.job.provider_refund_id) == (JobState.SUCCEEDED, "re_b")
    assert kinds(d) == ["enqueued@0", "claimed@1", "taken_over@2", "completed@2"]
    # R15: the zombie's receipt is filed, verified by its own grant, and changes nothing.
    obs, dup, _ = a.report_observation(operation_key=r["operation_key"], attempt=ca.attempt, lease_token=ca.lease_token,
                                       source="worker:py-zombie", outcome=Outcome.SUCCEEDED,
                                       provider_refund_id="re_zombie")
    assert not dup and obs.attempt_verified and obs.reported_attempt == 1 and obs.job_attempt == 2
    assert a.get_job(job.id).job.state is JobState.SUCCEEDED


def test_replay_after_a_lost_reply_R21(coord: Coordinator) -> None:
    c = coord.client()
    r = refund()
    job, _ = c.enqueue_refund(**r)
    cj = claim_one(c, "py-replay", r["provider"])
    first = c.complete(job.id, cj.attempt, cj.lease_token, "re_once")
    # The reply was lost: the worker repeats the same write.
    again = c.complete(job.id, cj.attempt, cj.lease_token, "re_once")
    assert (first.replayed, again.replayed) == (False, True)
    assert again.job.state is JobState.SUCCEEDED
    # A different write under the same grant after the job left running.
    with pytest.raises(JobNotRunningError):
        c.escalate(job.id, cj.attempt, cj.lease_token, "changed my mind")
    with pytest.raises(JobNotRunningError):
        c.complete(job.id, cj.attempt, cj.lease_token, "re_other")
    assert kinds(c.get_job(job.id)) == ["enqueued@0", "claimed@1", "completed@1"]


def test_int64_beyond_2_53(coord: Coordinator) -> None:
    c = coord.client()
    big = 2**53 + 1  # not a float: 9007199254740993
    r = refund(amount_minor=big)
    job, _ = c.enqueue_refund(**r)
    assert job.amount_minor == big
    cj = claim_one(c, "py-big", r["provider"])
    assert cj.job.amount_minor == big
    c.complete(job.id, cj.attempt, cj.lease_token, "re_big")
    assert c.get_job(job.id).job.amount_minor == big
    assert coord.sql(f"SELECT amount_minor FROM refund_ledger WHERE job_id = {job.id}").strip() == str(big)
    huge = 2**63 - 1
    job2, _ = c.enqueue_refund(**refund(amount_minor=huge))
    assert c.get_job(operation_key=job2.operation_key).job.amount_minor == huge


def test_typed_errors_from_the_coordinator_R24(coord: Coordinator) -> None:
    c = coord.client(retry=RetryPolicy(attempts=1))
    with pytest.raises(NotFoundError):
        c.get_job(987654321)
    with pytest.raises(InvalidArgumentError) as ia:
        c.claim("py-w", 0)
    assert "max_jobs" in ia.value.fields
    r = refund()
    c.enqueue_refund(**r)
    with pytest.raises(OperationKeyConflictError):
        c.enqueue_refund(**{**r, "amount_minor": r["amount_minor"] + 1})
    cj = claim_one(c, "py-w", r["provider"])
    with pytest.raises(JobNotInReviewError):
        c.resolve_review(cj.job.id, cj.attempt, refunded=False, note="not in review")
    c.escalate(cj.job.id, cj.attempt, cj.lease_token, "a person decides")
    with pytest.raises(JobNotRunningError):
        c.complete(cj.job.id, cj.attempt, cj.lease_token, "re")
    resolved = c.resolve_review(cj.job.id, cj.attempt, refunded=True, provider_refund_id="re_person", note="checked")
    assert resolved.job.state is JobState.SUCCEEDED
    # R21: the same resolution again is its replay.
    assert c.resolve_review(cj.job.id, cj.attempt, refunded=True, provider_refund_id="re_person", note="checked").replayed


def test_observation_limit_keeps_receipt_aside_R28(coord: Coordinator) -> None:
    # 999 receipts of the job's holders put on file in test data (filing them
    # one by one costs a minute of commits), then the 1,000th through the
    # API, then one too many: kept in the unmatched log, never refused.
    c = coord.client(retry=RetryPolicy(attempts=1))
    r = refund()
    job, _ = c.enqueue_refund(**r)
    coord.sql(
        "INSERT INTO refund_observations (job_id, operation_key, reported_attempt, job_attempt, source, outcome, "
        "detail, dedupe_key, created_at, attempt_verified) "
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 999) "
        f"SELECT {job.id}, '{r['operation_key']}', 1, 1, 'worker', 'pending', '', SHA2(CONCAT('{job.id}-', i), 256), "
        "UTC_TIMESTAMP(6), TRUE FROM n"
    )
    filed, _, _ = c.report_observation(job_id=job.id, source="webhook", outcome=Outcome.PENDING,
                                       provider_event_id="evt-1000")
    assert filed.id and not filed.kept_aside_id
    kept, dup, expedited = c.report_observation(job_id=job.id, source="webhook", outcome=Outcome.SUCCEEDED,
                                                provider_event_id="evt-1001")
    assert kept.id == 0 and kept.kept_aside_id and not dup and not expedited
    assert c.get_job(job.id).observation_count == 1000


def test_renewals_and_grant_too_old_R27() -> None:
    coord = start_coordinator("--max-grant-age", "2s")
    try:
        c = coord.client()
        r = refund()
        job, _ = c.enqueue_refund(**r)
        cj = claim_one(c, "py-renew", r["provider"], lease=1)
        [ok] = c.renew_leases([cj.grant()], lease=1)
        assert ok.refused is None and ok.lease_until is not None and ok.grant_expires_at is not None
        time.sleep(2.2)
        [old] = c.renew_leases([cj.grant()], lease=1)
        assert isinstance(old.refused, GrantTooOldError)
        # The grant stays valid until a takeover commits (R8).
        assert not c.complete(job.id, cj.attempt, cj.lease_token, "re_old").replayed
        [gone] = c.renew_leases([cj.grant()])
        assert isinstance(gone.refused, JobNotRunningError)
        [nf] = c.renew_leases([type(cj.grant())(job_id=987654321, attempt=1, lease_token=cj.lease_token)])
        assert isinstance(nf.refused, NotFoundError)
    finally:
        coord.stop()


def test_credentials_unauthenticated_and_permission_denied(tmp_path) -> None:
    def line(name: str, roles: str, token: str) -> str:
        return f"{name} {roles} sha256:{hashlib.sha256(token.encode()).hexdigest()}\n"

    tokens = tmp_path / "tokens"
    tokens.write_text(line("py-worker", "worker", "worker-token") + line("py-reader", "reader", "reader-token"))
    coord = start_coordinator("--tokens-file", str(tokens))
    try:
        def client(token: str) -> Client:
            return coord.client(token=token, plaintext_tokens=True, retry=RetryPolicy(attempts=1))

        assert client("worker-token").claim("py-w", 1, provider="nothing-here") == []
        with pytest.raises(UnauthenticatedError):
            client("wrong-token").claim("py-w", 1)
        with pytest.raises(UnauthenticatedError):
            coord.client(retry=RetryPolicy(attempts=1)).claim("py-w", 1)
        with pytest.raises(PermissionDeniedError):
            client("reader-token").claim("py-w", 1)
    finally:
        coord.stop()


def test_tls_with_a_bearer_token(tmp_path) -> None:
    # A self-signed certificate for 127.0.0.1: over TLS the token goes without
    # plaintext_tokens; a client that does not trust the certificate fails
    # before any token is sent.
    import subprocess

    import grpc

    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                    "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=jobfence-test",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
    tokens = tmp_path / "tokens"
    tokens.write_text(f"py-worker worker,producer sha256:{hashlib.sha256(b'tls-token').hexdigest()}\n")
    coord = start_coordinator("--tls-cert", str(cert), "--tls-key", str(key), "--tokens-file", str(tokens))
    try:
        creds = grpc.ssl_channel_credentials(cert.read_bytes())
        c = coord.client(tls=creds, token="tls-token")
        r = refund()
        job, created = c.enqueue_refund(**r)
        assert created
        assert claim_one(c, "py-tls", r["provider"]).job.id == job.id
        untrusting = coord.client(tls=True, token="tls-token", retry=RetryPolicy(attempts=1), call_timeout=5)
        with pytest.raises(UnavailableError):
            untrusting.claim("py-tls", 1)
        with pytest.raises(UnauthenticatedError):
            coord.client(tls=creds, token="wrong", retry=RetryPolicy(attempts=1)).claim("py-tls", 1)
    finally:
        coord.stop()
