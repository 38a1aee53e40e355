from __future__ import annotations

import os
import sys
from typing import Iterator

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
sys.path.insert(0, os.path.dirname(__file__))

from fakecoord import FakeCoordinator  # noqa: E402


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
