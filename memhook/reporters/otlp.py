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

from opentelemetry.proto.collector.profiles.v1development.profiles_service_pb2 import (
    ExportProfilesServiceRequest)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.profiles.v1development import profiles_pb2 as pb
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from .. import __version__
from ..common.format import LEAK_FRAME_LABEL, leak_frame
from .model import SAMPLE_TYPES, lost_sample_type
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
    """The export request for one process: `report` as model.build() made it (frames
    symbolized), `modules` the capture's module table."""
    return request_many([(report, modules, meta, start_ns, end_ns)], labels)


def request_many(parts: list, labels: dict) -> ExportProfilesServiceRequest:
    """One request for several processes, each (report, modules, meta, start_ns, end_ns): a
    resource (its process attributes) per process, one dictionary for all."""
    d = Dictionary()
    resources = []
    for report, modules, meta, start_ns, end_ns in parts:
        sample_rate = int(report["totals"].get("sample_rate") or 0)
        stacks = [(d.stack(s["frames"], modules), s) for s in report["sites"]]
        profiles = []
        for name, unit, key in tuple(reversed(SAMPLE_TYPES)) + lost_sample_type(report):
            # (in-use space first)
            p = pb.Profile(time_unix_nano=start_ns, duration_nano=max(end_ns - start_ns, 0))
            p.sample_type.type_strindex = d.string(name)
            p.sample_type.unit_strindex = d.string(unit)
            if sample_rate:
                p.period_type.type_strindex = d.string("space")
                p.period_type.unit_strindex = d.string("bytes")
                p.period = sample_rate
            for index, site in stacks:
                if site.get(key, 0) > 0:  # (the frame to fix, an attribute to group by)
                    p.samples.add(stack_index=index, values=[int(site[key])],
                                  attribute_indices=[d.attribute(LEAK_FRAME_LABEL,
                                                                 leak_frame(site))])
            profiles.append(p)
        scope = pb.ScopeProfiles(scope=InstrumentationScope(name="memhook", version=__version__),
                                 profiles=profiles)
        resource = Resource(attributes=_attributes(resource_attributes(meta, labels)))
        resources.append(pb.ResourceProfiles(resource=resource, scope_profiles=[scope]))
    return ExportProfilesServiceRequest(resource_profiles=resources, dictionary=d.d)


def capture_request(cap, report: dict, symbolizer, labels: dict | None = None, filters=None
                    ) -> ExportProfilesServiceRequest:
    """A capture's request: a resource per process (of a capture of several, each process's own
    report, symbolized with the files `symbolizer` already read)."""
    from .model import build
    parts = []
    for proc in cap.processes or [cap]:
        meta = proc.meta
        proc_rep = report if proc is cap else build(proc, symbolizer.for_modules(proc.modules),
                                                    filters)
        parts.append((proc_rep, proc.modules, meta, int(meta.get("started_at", 0) * 1e9),
                      int((meta.get("ended_at") or meta.get("started_at", 0)) * 1e9)))
    return request_many(parts, labels or {})


def render(cap, report: dict, symbolizer, labels: dict | None = None, filters=None, **_) -> bytes:
    return capture_request(cap, report, symbolizer, labels, filters).SerializeToString()
