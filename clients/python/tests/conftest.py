from __future__ import annotations

import logging
import os
import sys
from typing import Iterator

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
sys.path.insert(0, os.path.dirname(__file__))

from fakecoord import FakeCoordinator  # noqa: E402
from harness import Coordinator, start_coordinator  # noqa: E402
from workerrun import Records  # noqa: E402


@pytest.fixture(autouse=True)
def _cache_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    # A Worker's default receipt spool lives under the user's cache folder
    # (R28): each test gets one of its own, inherited by the processes it
    # starts, so that no test files another's receipts and none are left in
    # the real ~/.cache.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))


@pytest.fixture
def fake() -> Iterator[FakeCoordinator]:
    f = FakeCoordinator()
    yield f
    f.stop()


@pytest.fixture(scope="module")
def coord() -> Iterator[Coordinator]:
    """A real coordinator on a fresh database, one for each test module that asks for it."""
    c = start_coordinator()
    yield c
    c.stop()


@pytest.fixture
def logs(request: pytest.FixtureRequest) -> Iterator[tuple[logging.Logger, Records]]:
    """A logger of the test's own that nothing else hears, and its records."""
    log = logging.getLogger(f"jobfence.test.{request.node.name}")
    log.setLevel(logging.DEBUG)
    log.propagate = False
    h = Records()
    log.addHandler(h)
    yield log, h
    log.removeHandler(h)
