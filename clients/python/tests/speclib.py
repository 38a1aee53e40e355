"""What the runners of the shared spec (clients/spec) share: where it is,
this SDK's name in a dispute's answers, the check that a vector holds no
field a runner does not read, and the spec's forms of a handler's result and
of a coordinator status turned into this SDK's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import pytest

from jobfence import Result, ResultKind

from fakecoord import Fail

SPEC = Path(__file__).resolve().parents[2] / "spec"
#: This SDK's name in a dispute's ``answers``.
SDK = "python"
#: Fields for people, which no runner reads.
FOR_PEOPLE = {"note", "rules", "about"}


def known(obj: dict[str, Any], allowed: set[str], where: str) -> None:
    """Fails on a field of obj this runner does not read: the spec moved, the runner did not."""
    unknown = sorted(set(obj) - allowed - FOR_PEOPLE)
    if unknown:
        pytest.fail(f"{where} has fields this runner does not know: {unknown} (the spec moved, the runner did not)")


def result_of(r: dict[str, Any]) -> Result:
    """A handler's result in decide.json's form."""
    known(r, {"kind", "provider_refund_id", "retry_after_ms", "reason", "error"}, "result")
    return Result(kind=ResultKind(r.get("kind", "unknown")), provider_refund_id=r.get("provider_refund_id", ""),
                  retry_after=r["retry_after_ms"] / 1000 if "retry_after_ms" in r else None,
                  reason=r.get("reason", ""), error=OSError(r["error"]) if "error" in r else None)


def fail_of(st: dict[str, Any]) -> Fail:
    """A coordinator status in errors.json's form, as the scripted coordinator sends it."""
    known(st, {"code", "message", "reason", "domain", "metadata", "field_violations"}, "status")
    return Fail(grpc.StatusCode[st["code"]], st.get("reason", ""), st["message"], dict(st.get("metadata", {})),
                [(fv["field"], fv["description"]) for fv in st.get("field_violations", [])],
                st.get("domain", "jobfence"))
