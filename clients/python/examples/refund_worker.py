#!/usr/bin/env python3
"""refund_worker: the example jobfence worker in Python.

It takes refund jobs from a coordinator, refunds through the fake payment
provider (the ``fakeprovider`` command, a Stripe-like refunds API) over HTTP,
and writes each outcome back under the grant it was given, with this
package's Worker::

    python3 examples/refund_worker.py --coordinator 127.0.0.1:50051 --provider http://127.0.0.1:8099

The jobs come on the worker stream: the coordinator pushes grants as slots
free up, and the write-backs, renewals and receipts go on the same stream;
--no-stream claims with Claim calls (--claim-wait, --poll-interval) and writes
back with unary calls instead, as does a coordinator without the stream.

It works jobs until SIGTERM or SIGINT, then stops taking jobs and drains the
jobs in flight (a rolling deploy); a second signal acts as it would without
the worker (SIGINT: KeyboardInterrupt, SIGTERM: the process ends). Its flags
and environment variables are those of the Go and Node example workers
(cmd/refundworker, clients/node/examples/refund-worker.ts), so a fleet of all
three is configured alike: every flag falls back to REFUNDWORKER_<FLAG> (upper
case, '-' as '_'), e.g. REFUNDWORKER_COORDINATOR. Logs are JSON lines on
stderr; the last one, "refund-worker stopped", carries the worker's counters.
Every line about a job names it with job_id, operation_key, attempt and grant
(the lease token's fingerprint, R25); the token itself is never logged.

A receipt the coordinator cannot take (the fence refused the write-back, or
the write-back failed, and report_observation failed too) is kept in the
receipt spool, --receipt-spool, and filed when the worker next can, after a
restart too (R28); the spool's lines are those of the Go and Node workers. A
restart finds the spool by the worker id: with the default id, which holds the
pid, set --worker-id or --receipt-spool.

What it sends to the provider (R1, R2): the job's operation_key as the
Idempotency-Key and as the merchant_reference, never anything derived from the
attempt. What it makes of the answers:

    refund     200 succeeded → succeeded; 200 pending → pending (R4, not a
               success); 200 failed or 4xx → failed (a person decides);
               409 key reused → escalate (R1 broke somewhere); no reply → ask
               once by reference (a reconcile under this same grant, R14).
    reconcile  GET /v1/refunds?merchant_reference=<operation_key>, plus the
               refund ids of receipts already filed for the job (R15): one
               live refund → its status; none → no record, which proves
               nothing (R14: the Worker resends under the same key only inside
               the coordinator's resend window, else escalates); more than one
               → escalate.
    anything   no reply (a cut connection, the provider-call deadline), a 5xx,
               an unreadable body → the outcome is unknown and the job is
               reconciled later (R14).

Tracing (R35) follows the standard OTEL_* variables, as the coordinator's
does: off unless OTEL_TRACES_EXPORTER=otlp or an OTLP endpoint
(OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) is set,
and OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none keep it off. On, it
needs the OpenTelemetry SDK and OTLP exporter from PyPI (pip install
opentelemetry-api opentelemetry-sdk opentelemetry-exporter-otlp) and refuses
to start without them; spans go over OTLP/HTTP (protobuf) or, with
OTEL_EXPORTER_OTLP_PROTOCOL=grpc, gRPC; the SDK reads the endpoint, the
headers, the sampler and the resource (OTEL_SERVICE_NAME,
OTEL_RESOURCE_ATTRIBUTES; service.name defaults to jobfence-refund-worker)
itself. The provider is made global, so that an instrumented HTTP client's
spans are the attempt span's children.

The HTTP layer is http.client on purpose, one connection per request, and it
never sends a request twice: a client library that replays a POST on a fresh
connection (or follows a redirect with it) would resend a refund behind the
decision table's back (R14, R16).
"""

from __future__ import annotations

import argparse
import http.client
import json
import logging
import os
import re
import socket
import sys
import time
import urllib.parse
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

import jobfence  # noqa: E402
from jobfence import ClaimedJob, HandlerContext, ProviderPolicy, Result, ResultKind  # noqa: E402

# ---------------------------------------------------------------------------
# Tracing (R35)

DEFAULT_SERVICE_NAME = "jobfence-refund-worker"


class TracingConfigError(Exception):
    """An OTEL_* value the worker cannot use, or tracing asked for without
    the OpenTelemetry SDK installed."""


class Tracing:
    """The worker's tracing as the environment configured it: off
    (provider None: the Worker then uses OpenTelemetry's global provider,
    a no-op unless something set one) or the SDK exporting over OTLP."""

    def __init__(self, provider: Any = None, describe: Optional[dict[str, str]] = None) -> None:
        self.provider = provider
        self.describe = describe or {"tracing": "off"}

    def shutdown(self) -> None:
        """Flushes the spans still queued and stops the exporter."""
        if self.provider is not None:
            self.provider.shutdown()


def setup_tracing(env: dict[str, str]) -> Tracing:
    """Tracing from the standard OTEL_* variables of env (the SDK reads the
    process's environment for the rest). Raises TracingConfigError."""
    def get(k: str) -> str:
        return env.get(k, "").strip()

    exporter = get("OTEL_TRACES_EXPORTER").lower()
    endpoint = get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") + get("OTEL_EXPORTER_OTLP_ENDPOINT")
    if get("OTEL_SDK_DISABLED").lower() == "true" or exporter == "none" or (not exporter and not endpoint):
        return Tracing()
    if exporter and exporter != "otlp":
        raise TracingConfigError(f"OTEL_TRACES_EXPORTER={exporter}: refund_worker exports over OTLP only (otlp, or none)")
    protocol = get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf"
    if protocol not in ("http/protobuf", "grpc"):
        raise TracingConfigError(f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol}: want http/protobuf or grpc")
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        if protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        else:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError as e:
        raise TracingConfigError(
            f"tracing is asked for (OTEL_*) but the OpenTelemetry SDK is not installed ({e}): pip install "
            "opentelemetry-api opentelemetry-sdk opentelemetry-exporter-otlp, or unset OTEL_EXPORTER_OTLP_ENDPOINT "
            "and OTEL_TRACES_EXPORTER") from e
    # OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win over the default.
    named = get("OTEL_SERVICE_NAME") or "service.name=" in get("OTEL_RESOURCE_ATTRIBUTES")
    resource = Resource.create({} if named else {"service.name": DEFAULT_SERVICE_NAME})
    provider = TracerProvider(resource=resource)  # the sampler from OTEL_TRACES_SAMPLER
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    return Tracing(provider, {
        "tracing": "on", "exporter": "otlp", "protocol": protocol,
        "sampler": get("OTEL_TRACES_SAMPLER") or "parentbased_always_on",
        "service_name": str(resource.attributes.get("service.name", "")),
    })


# ---------------------------------------------------------------------------
# Configuration


def parse_duration(s: str) -> float:
    """A Go-style duration ("2s", "1500ms", "1m30s", "0") in seconds."""
    text = s.strip()
    if text == "0":
        return 0.0
    units = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
    total, at = 0.0, 0
    for m in re.finditer(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)", text):
        if m.start() != at:
            break
        total += float(m.group(1)) * units[m.group(2)]
        at = m.end()
    if at == 0 or at != len(text):
        raise argparse.ArgumentTypeError(f"{s!r} is not a duration (e.g. 2s, 1500ms, 1m30s)")
    return total


def parse_bool(s: str) -> bool:
    v = s.strip().lower()
    if v in ("1", "t", "true"):
        return True
    if v in ("0", "f", "false"):
        return False
    raise argparse.ArgumentTypeError(f"{s!r} is not a boolean")


def env_name(flag: str) -> str:
    return "REFUNDWORKER_" + flag.upper().replace("-", "_")


FLAGS: list[tuple[str, Callable[[str], Any], str, str]] = [
    ("coordinator", str, "127.0.0.1:50051", "coordinator gRPC address (host:port)"),
    ("tls", parse_bool, "false", "connect to the coordinator over TLS (system roots unless --tls-ca)"),
    ("tls-ca", str, "", "PEM file of the CA that signed the coordinator's certificate; implies --tls"),
    ("token-file", str, "", "file holding a bearer token sent with every coordinator call, re-read per call; "
                            "only over TLS or to a loopback coordinator"),
    ("call-timeout", parse_duration, "10s", "deadline of each coordinator call"),
    ("provider", str, "http://127.0.0.1:8099", "base URL of the payment provider (fakeprovider)"),
    ("provider-name", str, "acme", "the provider name of the jobs to claim"),
    ("worker-id", str, "", "this worker's name in job histories and observation sources "
                           "(default refund-worker-py-<hostname>-<pid>)"),
    ("concurrency", int, "4", "jobs worked at once (1..100); only that many are claimed (R18)"),
    ("lease", parse_duration, "30s", "lease to ask for (1s..15m); renewed while a job's provider calls run (R27)"),
    ("renew-interval", parse_duration, "0", "how often a running job's lease is renewed; 0: a third of the lease (R27)"),
    ("no-lease-renewal", parse_bool, "false", "never renew a lease: --lease must then outlast --provider-timeout (R17)"),
    ("no-stream", parse_bool, "false", "claim with Claim calls (--claim-wait, --poll-interval) and write back with unary "
                                       "calls instead of the worker stream, on which the coordinator pushes grants as "
                                       "slots free up"),
    ("provider-timeout", parse_duration, "3s", "deadline of each provider call"),
    ("same-key-resends", parse_bool, "true", "the provider honours same-key, same-body resends inside its "
                                             "idempotency-key window (fakeprovider does); false: every \"no record\" "
                                             "reconcile goes to manual review (R14, R16)"),
    ("resend-margin", parse_duration, "5m", "no same-key resend is started closer than this to the resend deadline (R22)"),
    ("pending-delay", parse_duration, "30s", "when to reconcile a pending refund again (R4)"),
    ("unknown-delay", parse_duration, "5s", "when to reconcile after a provider call whose outcome is unknown (R14)"),
    ("claim-wait", parse_duration, "10s", "with --no-stream: long-poll each claim up to this long (0..60s); 0: poll "
                                          "every --poll-interval"),
    ("poll-interval", parse_duration, "1s", "with --no-stream: pause after a claim that found too little work (without "
                                            "--claim-wait)"),
    ("drain-timeout", parse_duration, "30s", "on SIGTERM, how long jobs in flight may finish their provider call "
                                             "and write-back"),
    ("receipt-spool", str, "", "file keeping the receipts the coordinator could not take (R28), filed again before "
                               "the first claim and every 30s; a restart files them only from the same file, so keep "
                               "--worker-id (or this) stable. \"off\": such receipts are only logged (default "
                               "$XDG_CACHE_HOME or ~/.cache, then jobfence/<worker id>.receipts.jsonl)"),
    ("log-level", str, "info", "log level: debug, info, warn or error"),
]


def parse_config(argv: list[str], env: dict[str, str]) -> argparse.Namespace:
    """The command line, then REFUNDWORKER_* variables for flags not given, then the defaults."""
    p = argparse.ArgumentParser(
        prog="refund_worker.py",
        description="Works refund jobs from a jobfence coordinator against a payment provider until SIGTERM "
                    "(then drains). Every flag falls back to REFUNDWORKER_<FLAG> (upper case, '-' as '_').",
    )
    for name, kind, default, usage in FLAGS:
        shown = default or '""'
        extra: dict[str, Any] = {"nargs": "?", "const": "true"} if kind is parse_bool else {}
        p.add_argument(f"--{name}", default=None, metavar="VALUE", help=f"{usage} (default {shown})", **extra)
    ns = p.parse_args([a if not re.match(r"^-[a-z]", a) else "-" + a for a in argv])
    for name, kind, default, _ in FLAGS:
        attr = name.replace("-", "_")
        raw = getattr(ns, attr)
        source = f"--{name}"
        if raw is None:
            raw, source = (env[env_name(name)], env_name(name)) if env_name(name) in env else (default, "default")
        try:
            setattr(ns, attr, kind(raw))
        except (argparse.ArgumentTypeError, ValueError) as e:
            p.error(f"{source}: {e}")
    ns.provider = ns.provider.rstrip("/")
    ns.tls = ns.tls or bool(ns.tls_ca)
    if not ns.worker_id:
        ns.worker_id = f"refund-worker-py-{socket.gethostname()}-{os.getpid()}"[:128]
    u = urllib.parse.urlsplit(ns.provider)
    if u.scheme not in ("http", "https") or not u.netloc:
        p.error(f"--provider must be an http:// or https:// URL, got {ns.provider}")
    if not 1 <= ns.concurrency <= 100:
        p.error(f"--concurrency must be 1..100, got {ns.concurrency}")
    if not 1 <= ns.lease <= 900:
        p.error(f"--lease must be between 1s and 15m, got {ns.lease}s")
    if ns.provider_timeout <= 0:
        p.error("--provider-timeout must be positive")
    if ns.renew_interval and ns.renew_interval >= ns.lease:
        p.error("--renew-interval must be 0 (a third of the lease) or shorter than --lease")
    if not 0 <= ns.claim_wait <= 60:
        p.error("--claim-wait must be 0..60s")
    if ns.log_level not in LEVELS:
        p.error("--log-level must be debug, info, warn or error")
    if ns.token_file and not ns.tls and not is_loopback(ns.coordinator):
        p.error("--token-file needs TLS (--tls or --tls-ca) unless the coordinator is on loopback: "
                "a bearer token never crosses a network in plaintext")
    return ns


def is_loopback(address: str) -> bool:
    host = re.sub(r":\d+$", "", re.sub(r"^[a-z]+://", "", address)).strip("[]")
    return host in ("localhost", "::1") or re.match(r"^127\.\d+\.\d+\.\d+$", host) is not None


# ---------------------------------------------------------------------------
# Logging: JSON lines on stderr, the records' extra fields included.

LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warn": logging.WARNING, "error": logging.ERROR}
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


class JSONFormatter(logging.Formatter):
    def __init__(self, base: dict[str, Any]) -> None:
        super().__init__()
        self.base = base

    def format(self, record: logging.LogRecord) -> str:
        rec: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower().replace("warning", "warn"),
            "msg": record.getMessage(),
            **self.base,
        }
        for k, v in vars(record).items():
            if k not in _STANDARD:
                rec[k] = v if isinstance(v, (str, int, float, bool, type(None), dict, list)) else str(v)
        if record.exc_info:
            rec["exception"] = self.formatException(record.exc_info)
        return json.dumps(rec)


# ---------------------------------------------------------------------------
# The provider over HTTP


class NoReply(Exception):
    """No complete HTTP reply came (refused, cut, timed out): the request may
    or may not have been processed, the outcome is unknown (T3)."""


class ProviderStatus(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"provider: {status} {code}: {message}")
        self.status = status
        self.code = code


class Provider:
    """The fake provider's refunds API. Each call sends exactly one HTTP
    request on a connection of its own: nothing here repeats a request,
    whatever the answer (or its absence)."""

    def __init__(self, base_url: str) -> None:
        u = urllib.parse.urlsplit(base_url)
        self.https = u.scheme == "https"
        self.netloc = u.netloc
        self.prefix = u.path.rstrip("/")

    def _request(self, method: str, path: str, timeout: float, body: Optional[bytes] = None,
                 headers: Optional[dict[str, str]] = None) -> tuple[int, bytes]:
        if timeout <= 0:
            raise NoReply(f"no time left before {method} {path}")
        cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
        conn = cls(self.netloc, timeout=timeout)
        try:
            h = {"Accept": "application/json", **(headers or {})}
            if body is not None:
                h["Content-Type"] = "application/json"
            conn.request(method, self.prefix + path, body=body, headers=h)
            resp = conn.getresponse()
            return resp.status, resp.read()
        except (OSError, http.client.HTTPException) as e:
            raise NoReply(f"provider: no reply to {method} {path}: {e}") from e
        finally:
            conn.close()

    @staticmethod
    def _decode(status: int, body: bytes) -> Any:
        if status >= 300:
            code, message = "", body.decode(errors="replace").strip()
            try:
                err = json.loads(body).get("error") or {}
                code, message = err.get("code", ""), err.get("message", message)
            except ValueError:
                pass
            raise ProviderStatus(status, code, message)
        return json.loads(body)  # a reply we cannot read tells nothing: unknown outcome

    def create_refund(self, key: str, job: jobfence.Job, timeout: float) -> dict[str, Any]:
        """POST /v1/refunds under the operation key (R1): it is the
        Idempotency-Key and the merchant reference; the attempt is never sent (R2)."""
        body = json.dumps({"payment_id": job.payment_id, "amount_minor": job.amount_minor, "currency": job.currency,
                           "merchant_reference": key}).encode()
        status, raw = self._request("POST", "/v1/refunds", timeout, body, {"Idempotency-Key": key})
        return dict(self._decode(status, raw))

    def find_by_reference(self, ref: str, timeout: float) -> list[dict[str, Any]]:
        q = urllib.parse.urlencode({"merchant_reference": ref})
        status, raw = self._request("GET", f"/v1/refunds?{q}", timeout)
        return list(self._decode(status, raw).get("data") or [])

    def get_refund(self, refund_id: str, timeout: float) -> Optional[dict[str, Any]]:
        status, raw = self._request("GET", f"/v1/refunds/{urllib.parse.quote(refund_id, safe='')}", timeout)
        if status == 404:
            return None  # under lookup lag this proves nothing (R14)
        return dict(self._decode(status, raw))


def result_of(r: dict[str, Any]) -> Result:
    """One provider refund as a Result (R4: pending is not success)."""
    status = r.get("status")
    if status == "succeeded":
        return Result.succeeded(str(r["id"]))
    if status == "pending":
        return Result.pending(str(r["id"]), reason=f"refund {r['id']} pending")
    if status == "failed":
        return Result.failed(str(r["id"]), f"provider: refund {r.get('failure_reason') or 'failed'}")
    return Result.unknown(ValueError(f"provider: refund {r.get('id')} in unknown status {status!r}"))


class Refunds:
    """The Worker's handler: it talks to the provider under the job's
    operation key, never anything derived from the attempt (R1, R2)."""

    def __init__(self, pay: Provider) -> None:
        self.pay = pay

    def refund(self, job: ClaimedJob, ctx: HandlerContext) -> Result:
        # A grant lost before the request goes out sends nothing (R27); one
        # lost while it is in flight still waits for its answer, which the
        # Worker files as an observation (R15).
        if ctx.cancelled():
            return Result.unknown(ctx.cause)
        key = job.job.operation_key
        try:
            return result_of(self.pay.create_refund(key, job.job, ctx.remaining()))
        except ProviderStatus as e:
            if e.code == "idempotency_key_reused":
                return Result.escalate("provider: Idempotency-Key already used with different parameters (R1)")
            if 400 <= e.status < 500:
                # Refused as invalid: nothing is stored under the key.
                return Result.failed("", str(e))
            return Result.unknown(e)  # 5xx: a real provider does not promise it did nothing
        except NoReply as e:
            if not ctx.cancelled():
                # Ask once by reference before giving up (a reconcile under
                # this same grant, R14): a late worker still learns what happened.
                res = self.reconcile(job, ctx)
                if res.kind is not ResultKind.NO_RECORD:
                    return res
            # "No record" right after a lost reply proves nothing (R14).
            return Result.unknown(e)
        except ValueError as e:
            return Result.unknown(e)

    def reconcile(self, job: ClaimedJob, ctx: HandlerContext) -> Result:
        key = job.job.operation_key
        try:
            found = self.pay.find_by_reference(key, ctx.remaining())
            # R15: receipts already filed for the job name refund ids; verify
            # the ones the lookup did not return.
            for o in job.observations:
                rid = o.provider_refund_id
                if not rid or any(f.get("id") == rid for f in found):
                    continue
                r = self.pay.get_refund(rid, ctx.remaining())
                if r is not None and r.get("merchant_reference") == key:
                    found.append(r)
        except (NoReply, ProviderStatus, ValueError) as e:
            return Result.unknown(e)
        live = [f for f in found if f.get("status") != "failed"]
        if len(live) > 1:
            return Result.escalate(f"provider shows {len(live)} live refunds for this operation key: "
                                   f"{[f.get('id') for f in live]}")
        if live:
            return result_of(live[0])
        if found:
            return result_of(found[-1])
        return Result.no_record("no refund under this merchant reference")


# ---------------------------------------------------------------------------
# main


def main(argv: list[str]) -> int:
    c = parse_config(argv, dict(os.environ))
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JSONFormatter({"worker_id": c.worker_id}))
    log = logging.getLogger("refund_worker")
    for lg in (log, logging.getLogger("jobfence")):
        lg.handlers[:] = [handler]
        lg.setLevel(LEVELS[c.log_level])
        lg.propagate = False

    try:
        tr = setup_tracing(dict(os.environ))
    except TracingConfigError as e:
        print(f"refund_worker: {e}", file=sys.stderr)
        return 2
    log.info("tracing", extra=tr.describe)
    if c.no_lease_renewal and c.provider_timeout >= c.lease:
        log.warning("--provider-timeout is not shorter than --lease and leases are not renewed: slow provider "
                    "calls will be taken over (R17)")
    tls: Any = False
    if c.tls:
        import grpc

        tls = grpc.ssl_channel_credentials(Path(c.tls_ca).read_bytes()) if c.tls_ca else True
    token = None
    if c.token_file:
        path = c.token_file
        token = lambda: Path(path).read_text().strip()  # noqa: E731 - re-read per call
    client = jobfence.Client(c.coordinator, tls=tls, token=token, plaintext_tokens=not c.tls,
                             call_timeout=c.call_timeout, logger=logging.getLogger("jobfence"))
    try:
        worker = jobfence.Worker(
            client,
            Refunds(Provider(c.provider)),
            worker_id=c.worker_id,
            concurrency=c.concurrency,
            lease=c.lease,
            lease_renewal=not c.no_lease_renewal,
            renew_interval=c.renew_interval or None,
            provider=c.provider_name,
            provider_timeout=c.provider_timeout,
            policy=ProviderPolicy(same_key_resend_safe=c.same_key_resends, resend_margin=c.resend_margin,
                                  pending_delay=c.pending_delay, unknown_delay=c.unknown_delay),
            no_stream=c.no_stream,
            claim_wait=c.claim_wait,
            poll_interval=c.poll_interval,
            drain_timeout=c.drain_timeout,
            receipt_spool=c.receipt_spool,
            logger=logging.getLogger("jobfence.worker"),
            tracer_provider=tr.provider,
        )
    except (jobfence.ReceiptSpoolLockedError, OSError) as e:
        # Another worker holds the spool (the same --worker-id on this
        # machine), or it cannot be created (R28).
        log.error("receipt spool", extra={"spool": c.receipt_spool or "default", "error": str(e)})
        client.close()
        return 1
    log.info("refund-worker started", extra={
        "coordinator": c.coordinator, "provider": c.provider, "provider_name": c.provider_name,
        "concurrency": c.concurrency, "lease_s": c.lease, "provider_timeout_s": c.provider_timeout, "pid": os.getpid(),
        "receipt_spool": worker.receipt_spool or "off", "stream": not c.no_stream,
    })
    drained = True
    try:
        worker.run(install_signal_handlers=True)
    except jobfence.DrainTimeoutError:
        # Their leases expire and a takeover reconciles them (R6, R14).
        drained = False
        log.warning("drain timeout: jobs still in flight are cut off", extra={"in_flight": worker.in_flight})
    finally:
        client.close()
        try:
            tr.shutdown()  # the spans still queued
        except Exception as e:  # noqa: BLE001 - the refunds are done; spans are not worth a failure
            log.warning("tracing: spans not exported", extra={"error": str(e)})
    log.info("refund-worker stopped", extra={"drained": drained, "stats": worker.stats().as_dict()})
    return 0 if drained else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
