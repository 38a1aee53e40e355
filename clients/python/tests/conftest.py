from __future__ import annotations

import os
import sys
from typing import Iterator

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
sys.path.insert(0, os.path.dirname(__file__))

from fakecoord import FakeCoordinator  # noqa: E402


@pytest.fixture
def fake() -> Iterator[FakeCoordinator]:
    f = FakeCoordinator()
    yield f
    f.stop()
