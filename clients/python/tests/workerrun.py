"""A Worker as the tests run it: on a thread of its own until the test stops
it (Running), or for a set time (run_for); and what its logger wrote
(Records, given by the logs fixture)."""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Optional

from jobfence import Worker


class Running:
    """A Worker run on a thread. stop() stops it, fails the test unless it
    drains within drain seconds, and raises what run() raised."""

    def __init__(self, w: Worker, drain: float = 60) -> None:
        self.w = w
        self.drain = drain
        self.error: Optional[BaseException] = None
        self.t = threading.Thread(target=self._run, daemon=True)
        self.t.start()

    def _run(self) -> None:
        try:
            self.w.run()
        except BaseException as e:  # noqa: BLE001
            self.error = e

    def stop(self) -> None:
        self.w.stop()
        self.t.join(self.drain)
        assert not self.t.is_alive(), "the worker did not drain"
        if self.error is not None:
            raise self.error


def run_for(w: Worker, seconds: float, drain: float = 30) -> None:
    """Runs w for seconds, then stops it; fails the test unless it drains
    within drain seconds."""
    t = threading.Thread(target=w.run, daemon=True)
    t.start()
    time.sleep(seconds)
    w.stop()
    t.join(drain)
    assert not t.is_alive()


class Records(logging.Handler):
    """Keeps every record a logger gets, its extra fields included."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def msgs(self) -> list[str]:
        return [r.getMessage() for r in self.records]

    def text(self) -> str:
        return "\n".join(json.dumps(vars(r), default=str) for r in self.records)
