"""OTLP profiles: a traced process's current profile as an OTLP/HTTP export request, built with
opentelemetry-proto's generated classes (profiles v1development).

One Profile per sample type, as the signal has it: in-use space and objects, allocated space and
objects (pprof's four). Stacks, locations (one per return address, its inlined frames as lines),
functions and mappings go in the request's dictionary, each table starting with its zero value;
mappings carry the module's build-id so that a backend can symbolize elsewhere. In sampling mode
the values are the consumer's unbiased estimates and each profile states its period."""
from __future__ import annotations

import os
import socket
import sys

from opentelemetry.proto.collector.profiles.v1development.profiles_service_pb2 import (
    ExportProfilesServiceRequest)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.profiles.v1development import profiles_pb2 as pb
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

SAMPLE_TYPES = (("inuse_space", "bytes", "outstanding_bytes"),
                ("inuse_objects", "count", "outstanding_count"),
                ("alloc_space", "bytes", "alloc_bytes"),
                ("alloc_objects", "count", "alloc_count"))
BUILD_ID = "process.executable.build_id.gnu"  # semantic conventions' key


class Dictionary:
    """The request's shared tables, each entry added once."""

    def __init__(self):
        self.d = pb.ProfilesDictionary()
        self.d.mapping_table.add()
        self.d.location_table.add()
        self.d.function_table.add()
        self.d.link_table.add()
        self.d.attribute_table.add()
        self.d.stack_table.add()
        self.d.string_table.append("")
        self._strings = {"": 0}
        self._index: dict = {}

    def string(self, s: str) -> int:
        if s not in self._strings:
            self._strings[s] = len(self.d.string_table)
            self.d.string_table.append(s)
        return self._strings[s]

    def _once(self, key, table, make) -> int:
        if key not in self._index:
            self._index[key] = len(table)
            make(table.add())
        return self._index[key]

    def attribute(self, key: str, value: str) -> int:
        def make(a):
            a.key_strindex = self.string(key)
            a.value.string_value = value
        return self._once(("attr", key, value), self.d.attribute_table, make)

    def mapping(self, module: dict) -> int:
        def make(m):
            m.memory_start, m.memory_limit = module["lo"], module["hi"]
            m.file_offset = max(module["lo"] - module["bias"], 0)
            m.filename_strindex = self.string(module["path"])
            if module.get("build_id"):
                m.attribute_indices.append(self.attribute(BUILD_ID, module["build_id"]))
        return self._once(("map", module["path"], module.get("build_id"), module["lo"]),
                          self.d.mapping_table, make)

    def function(self, name: str, file: str | None) -> int:
        def make(f):
            f.name_strindex = f.system_name_strindex = self.string(name)
            f.filename_strindex = self.string(file or "")
        return self._once(("fn", name, file), self.d.function_table, make)

    def location(self, frames: list, modules: list) -> int:
        """One return address: its frames, innermost (inlined) first, become its lines."""
        address = int(frames[0]["address"], 16)
        module = next((m for m in modules if m["lo"] <= address < m["hi"]), None)
        # Processes sharing the dictionary may map different files at one address.
        mapping = self.mapping(module) if module else 0

        def make(loc):
            loc.address, loc.mapping_index = address, mapping
            for f in frames:
                if f["function"]:
                    loc.lines.add(function_index=self.function(f["function"], f["file"]),
                                  line=f["line"] or 0)
        return self._once(("loc", address, mapping), self.d.location_table, make)

    def stack(self, frames: list, modules: list) -> int:
        # Inlined frames share their caller's address: one location per address, leaf first.
        groups: list = []
        for f in frames:
            if groups and groups[-1][-1].get("inlined"):
                groups[-1].append(f)
            else:
                groups.append([f])
        locations = tuple(self.location(g, modules) for g in groups)

        def make(s):
            s.location_indices.extend(locations)
        return self._once(("stack", locations), self.d.stack_table, make)


def _attributes(pairs: dict) -> list:
    out = []
    for k, v in pairs.items():
        value = AnyValue(int_value=v) if isinstance(v, int) else AnyValue(string_value=str(v))
        out.append(KeyValue(key=k, value=value))
    return out


def resource_attributes(meta: dict, labels: dict) -> dict:
    """host.name, process.pid, process.executable.name, process.command_line, service.name
    (from --label service=...), then the user's labels."""
    attrs = {"host.name": meta.get("host") or socket.gethostname(),
             "process.pid": int(meta.get("pid") or 0),
             "process.executable.name": os.path.basename(meta.get("exe") or ""),
             "process.command_line": meta.get("command") or ""}
    if "service" in labels:
        attrs["service.name"] = labels["service"]
    attrs.update({k: v for k, v in labels.items() if k != "service"})
    return attrs


def request(report: dict, modules: list, meta: dict, labels: dict, start_ns: int,
            end_ns: int) -> ExportProfilesServiceRequest:
    """The export request for one process: `report` as report.build() made it (frames
    symbolized), `modules` the capture's module table."""
    return request_many([(report, modules, meta, start_ns, end_ns)], labels)


def request_many(parts: list, labels: dict) -> ExportProfilesServiceRequest:
    """One request for several processes, each (report, modules, meta, start_ns, end_ns): a
    resource (its process attributes) per process, one dictionary for all."""
    from . import __version__
    d = Dictionary()
    resources = []
    for report, modules, meta, start_ns, end_ns in parts:
        sample_rate = int(report["totals"].get("sample_rate") or 0)
        stacks = [(d.stack(s["frames"], modules), s) for s in report["sites"]]
        profiles = []
        for name, unit, key in SAMPLE_TYPES:
            p = pb.Profile(time_unix_nano=start_ns, duration_nano=max(end_ns - start_ns, 0))
            p.sample_type.type_strindex = d.string(name)
            p.sample_type.unit_strindex = d.string(unit)
            if sample_rate:
                p.period_type.type_strindex = d.string("space")
                p.period_type.unit_strindex = d.string("bytes")
                p.period = sample_rate
            for index, site in stacks:
                if site[key] > 0:
                    p.samples.add(stack_index=index, values=[int(site[key])])
            profiles.append(p)
        scope = pb.ScopeProfiles(scope=InstrumentationScope(name="memhook", version=__version__),
                                 profiles=profiles)
        resource = Resource(attributes=_attributes(resource_attributes(meta, labels)))
        resources.append(pb.ResourceProfiles(resource=resource, scope_profiles=[scope]))
    return ExportProfilesServiceRequest(resource_profiles=resources, dictionary=d.d)


PATH = "/v1development/profiles"


class PushError(Exception):
    """A push the collector did not take, as one line."""


def endpoint(url: str) -> str:
    """The OTLP/HTTP profiles endpoint of a collector URL (http://host:4318), as given if it
    already names the path."""
    return url if url.rstrip("/").endswith(PATH) else url.rstrip("/") + PATH


def post(url: str, body: bytes, content_type: str, timeout_s: float) -> bytes:
    """POST with a timeout; the answer's body. Raises PushError (one line)."""
    import urllib.error
    import urllib.request
    http = urllib.request.Request(url, data=body, method="POST",
                                  headers={"Content-Type": content_type})
    try:
        with urllib.request.urlopen(http, timeout=timeout_s) as resp:
            return resp.read()
    except urllib.error.HTTPError as e:
        raise PushError(f"{url.split('?')[0]} answered HTTP {e.code}") from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise PushError(f"{url.split('?')[0]} could not be reached: {reason}") from None


def push(url: str, req: ExportProfilesServiceRequest, timeout_s: float = 5.0) -> int:
    """POST the request (protobuf) to the collector; returns the profiles it rejected (OTLP's
    partial success). Raises PushError."""
    from opentelemetry.proto.collector.profiles.v1development.profiles_service_pb2 import (
        ExportProfilesServiceResponse)
    body = post(endpoint(url), req.SerializeToString(), "application/x-protobuf", timeout_s)
    answer = ExportProfilesServiceResponse()
    try:
        answer.ParseFromString(body)
    except Exception:  # noqa: BLE001 (a collector that answers 200 with something else)
        return 0
    return int(answer.partial_success.rejected_profiles)


class Pusher:
    """The traced processes' profiles, sent every `interval` seconds and at detach, on a thread
    of its own: the consumers' threads never wait for a collector. Each push (one request, a
    resource per process) is built on this thread (symbolized as it goes) and posted with a
    timeout. A push that fails stays queued, at most BACKLOG of them (the oldest dropped and
    counted); after a failure the next attempt waits twice as long as the last, from one
    interval up to BACKOFF_MAX_S, while profiles keep being queued."""

    BACKLOG = 4
    TIMEOUT_S = 5.0
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

        from . import report
        from .capture import current
        from .symbolize import Symbolizer
        parts = []
        for session in sessions:
            cap = current(session)
            if self._symbolizer is None:
                self._symbolizer = Symbolizer(cap.modules)
            else:
                self._symbolizer.set_modules(cap.modules)
            rep = report.build(cap, self._symbolizer)
            end = session.ended_at or time.time()
            parts.append(self.sink.part(cap, rep, self._symbolizer,
                                        int(session.started_at * 1e9), int(end * 1e9)))
        return self.sink.build(parts)


class OtlpSink:
    """Pusher's payload for an OTLP/HTTP collector: one export request for every process."""

    def __init__(self, url: str, labels: dict):
        self.url, self.labels, self.endpoint = url, labels, endpoint(url)

    def part(self, cap, rep, symbolizer, start_ns: int, end_ns: int):
        return rep, cap.modules, cap.meta, start_ns, end_ns

    def build(self, parts: list) -> list:
        return [request_many(parts, self.labels)]

    def send(self, req: ExportProfilesServiceRequest) -> None:
        push(self.url, req, Pusher.TIMEOUT_S)
