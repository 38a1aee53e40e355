"""The channel a Client dials: keepalive by default (KEEPALIVE_OPTIONS, so
that a silently dead coordinator is noticed and the worker stream's calls are
repeated on a new connection, R21), each default replaced by a
channel_options entry of the same name, the others passed as given."""

from __future__ import annotations

from jobfence import KEEPALIVE_OPTIONS
from jobfence.client import _channel_options


def test_keepalive_by_default() -> None:
    assert _channel_options(()) == list(KEEPALIVE_OPTIONS)
    assert dict(KEEPALIVE_OPTIONS) == {
        # The coordinator's minimum: more frequent pings are answered with
        # GOAWAY "too_many_pings".
        "grpc.keepalive_time_ms": 10_000,
        "grpc.keepalive_timeout_ms": 5_000,
        "grpc.keepalive_permit_without_calls": 1,
    }


def test_channel_options_replace_the_defaults_of_their_name() -> None:
    given = [("grpc.keepalive_time_ms", 30_000), ("grpc.max_reconnect_backoff_ms", 500)]
    assert _channel_options(given) == [("grpc.keepalive_timeout_ms", 5_000),
                                       ("grpc.keepalive_permit_without_calls", 1), *given]
