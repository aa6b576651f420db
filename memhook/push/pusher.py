"""Pushing the traced processes' profiles every interval, on a thread of its own, to a sink
(sinks.py: an OTLP collector, Pyroscope's ingest API)."""
from __future__ import annotations

import sys

from ..capture import current
from ..reporters import model
from ..symbolize import Symbolizer
from .http import PushError


class Pusher:
    """The traced processes' profiles, sent every `interval` seconds and at detach, on a thread
    of its own: the consumers' threads never wait for a collector. Each push (one request, a
    resource per process) is built on this thread (symbolized as it goes) and posted with a
    timeout. A push that fails stays queued, at most BACKLOG of them (the oldest dropped and
    counted); after a failure the next attempt waits twice as long as the last, from one
    interval up to BACKOFF_MAX_S, while profiles keep being queued."""

    BACKLOG = 4
    BACKOFF_MAX_S = 300.0

    def __init__(self, sessions: list, sink, interval: float):
        import collections
        import threading
        self.sink, self.interval = sink, interval
        self.endpoint = sink.endpoint
        self._sessions = list(sessions)
        self._retired: list = []  # ended sessions: in the next push, their last
        self._lock = threading.Lock()
        self.sent = self.failed = self.dropped = 0
        self.last_error = ""
        self._backoff = 0.0
        self._next_try = 0.0
        self._failing_since = 0  # the failure count when pushes began to fail
        self._queue: collections.deque = collections.deque()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="memhook-push", daemon=True)
        self._symbolizer = None

    def start(self) -> None:
        self._thread.start()

    def add(self, session) -> None:
        with self._lock:
            self._sessions.append(session)

    def retire(self, session) -> None:
        """A session that ended (after its detach): its final profile goes in the next push."""
        with self._lock:
            if any(s is session for s in self._sessions):  # (identity: sessions hold arrays)
                self._sessions = [s for s in self._sessions if s is not session]
                self._retired.append(session)

    def stop(self) -> None:
        """After detach: one last push of the final profiles, then the thread ends."""
        self._stop.set()
        self._thread.join()
        self._enqueue()
        self._next_try = 0.0
        self._flush()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._enqueue()
            self._flush()

    def _enqueue(self) -> None:
        with self._lock:
            sessions = self._sessions + self._retired
            self._retired = []
        if not sessions:
            return
        try:
            self._queue.append(self.snapshot(sessions))
        except Exception as e:  # noqa: BLE001 (a push is never worth memhook's life)
            self.failed += 1
            self.last_error = f"could not build the profile: {e}"
            return
        while len(self._queue) > self.BACKLOG:
            self._queue.popleft()
            self.dropped += 1

    def _flush(self) -> None:
        import time
        if time.monotonic() < self._next_try:
            return
        while self._queue:
            payloads = self._queue[0]  # what one push sends, less what already went
            try:
                while payloads:
                    self.sink.send(payloads[0])
                    payloads.pop(0)
            except PushError as e:
                self.failed += 1
                self.last_error = str(e)
                self._backoff = min(max(self._backoff * 2, self.interval), self.BACKOFF_MAX_S)
                self._next_try = time.monotonic() + self._backoff
                if not self._failing_since:  # said once, not at every retry
                    self._failing_since = self.failed
                    print(f"memhook: push failed: {e}; retrying, less often while it fails",
                          file=sys.stderr, flush=True)
                return
            self._queue.popleft()
            self.sent += 1
            self._backoff = 0.0
            if self._failing_since:
                print(f"memhook: pushes to {self.endpoint} arrive again "
                      f"({self.failed - self._failing_since + 1} failed meanwhile)",
                      file=sys.stderr, flush=True)
                self._failing_since = 0

    def snapshot(self, sessions: list):
        """The sessions' profiles now, from their consumers' aggregates: the payloads the sink
        sends for one push."""
        import time
        parts = []
        for session in sessions:
            cap = current(session)
            if self._symbolizer is None:
                self._symbolizer = Symbolizer(cap.modules)
            else:
                self._symbolizer.set_modules(cap.modules)
            rep = model.build(cap, self._symbolizer)
            end = session.ended_at or time.time()
            parts.append(self.sink.part(cap, rep, self._symbolizer,
                                        int(session.started_at * 1e9), int(end * 1e9)))
        return self.sink.build(parts)
