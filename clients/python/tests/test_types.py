"""The lease token is a secret (R25): it never prints, its fingerprint does."""

from __future__ import annotations

import hashlib
import logging
import pickle

import pytest

from jobfence import LeaseToken


def test_lease_token_never_prints_R25(caplog: pytest.LogCaptureFixture) -> None:
    t = LeaseToken("s3cr3t-token-value")
    for shown in (str(t), repr(t), f"{t}", f"{t:>30}", "%s" % t, str([t]), str({"t": t})):
        assert "s3cr3t" not in shown, shown
    with caplog.at_level(logging.INFO):
        logging.getLogger("t").info("token %s", t)
    assert "s3cr3t" not in caplog.text
    with pytest.raises(TypeError):
        pickle.dumps(t)
    assert t.reveal() == "s3cr3t-token-value"


def test_fingerprint_is_the_first_six_bytes_of_the_sha256_R25() -> None:
    t = LeaseToken("abc")
    assert t.fingerprint() == hashlib.sha256(b"abc").hexdigest()[:12]
    assert LeaseToken("").fingerprint() == ""
    assert LeaseToken("a") == LeaseToken("a") and LeaseToken("a") != LeaseToken("b")
    assert not LeaseToken("") and LeaseToken("x")
