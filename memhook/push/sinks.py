"""Where pushes go: an OTLP/HTTP collector (one export request for every process) or
Pyroscope's ingest API (per process, its gzip pprof). Each sink turns a push's parts into
payloads and sends one; the Pusher decides when."""
from __future__ import annotations

import json
import os
import re
import secrets
from urllib.parse import urlencode

from opentelemetry.proto.collector.profiles.v1development.profiles_service_pb2 import (
    ExportProfilesServiceResponse)

from ..reporters.otlp import request_many
from ..reporters.pprof import profile
from .http import post

TIMEOUT_S = 5.0
PATH = "/v1development/profiles"


def endpoint(url: str) -> str:
    """The OTLP/HTTP profiles endpoint of a collector URL (http://host:4318), as given if it
    already names the path."""
    return url if url.rstrip("/").endswith(PATH) else url.rstrip("/") + PATH


def push(url: str, req, timeout_s: float = TIMEOUT_S) -> int:
    """POST the request (protobuf) to the collector; returns the profiles it rejected (OTLP's
    partial success). Raises PushError."""
    body = post(endpoint(url), req.SerializeToString(), "application/x-protobuf", timeout_s)
    answer = ExportProfilesServiceResponse()
    try:
        answer.ParseFromString(body)
    except Exception:  # noqa: BLE001 (a collector that answers 200 with something else)
        return 0
    return int(answer.partial_success.rejected_profiles)


class OtlpSink:
    """Pusher's payload for an OTLP/HTTP collector: one export request for every process."""

    def __init__(self, url: str, labels: dict):
        self.url, self.labels, self.endpoint = url, labels, endpoint(url)

    def part(self, cap, rep, symbolizer, start_ns: int, end_ns: int):
        return rep, cap.modules, cap.meta, start_ns, end_ns

    def build(self, parts: list) -> list:
        return [request_many(parts, self.labels)]

    def send(self, req) -> None:
        push(self.url, req, TIMEOUT_S)


# ---- Pyroscope's ingest API ----

LABEL_KEY = re.compile(r"[^A-Za-z0-9_]")
LABEL_VALUE = re.compile(r"[{},=\s]")
# Pyroscope's aggregation per sample type: in-use figures are levels, not sums over time.
SAMPLE_TYPE_CONFIG = {"inuse_space": {"units": "bytes", "aggregation": "average"},
                      "inuse_objects": {"units": "objects", "aggregation": "average"},
                      "alloc_space": {"units": "bytes"}, "alloc_objects": {"units": "objects"}}


def ingest_url(base: str, meta: dict, labels: dict, start_s: int, end_s: int) -> str:
    """POST target for one process's profile: Pyroscope's /ingest with its query (README,
    "Fleet")."""
    app = labels.get("service") or os.path.basename(meta.get("exe") or "") or "memhook"
    tags = {"pid": meta.get("pid") or 0, "host": meta.get("host") or "",
            **{k: v for k, v in labels.items() if k != "service"}}
    name = LABEL_VALUE.sub("_", app) + "{" + ",".join(
        f"{LABEL_KEY.sub('_', k)}={LABEL_VALUE.sub('_', str(v))}" for k, v in tags.items()) + "}"
    query = urlencode({"name": name, "from": start_s, "until": end_s, "format": "pprof",
                       "spyName": "memhook"})
    return f"{base}?{query}"


def multipart(fields: dict) -> tuple[bytes, str]:
    """multipart/form-data with one file per field; returns the body and its Content-Type."""
    boundary = "memhook" + secrets.token_hex(12)
    body = bytearray()
    for name, (filename, data) in fields.items():
        body += (f"--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"; "
                 f"filename=\"{filename}\"\r\nContent-Type: application/octet-stream\r\n\r\n"
                 ).encode() + data + b"\r\n"
    body += f"--{boundary}--\r\n".encode()
    return bytes(body), f"multipart/form-data; boundary={boundary}"


class PyroscopeSink:
    """Pusher's payloads for Pyroscope's ingest API: per process, its gzip pprof as the form
    field `profile`, with `sample_type_config`, to /ingest?name=APP{pid=..,host=..}&from=..&until=..&format=pprof."""

    def __init__(self, url: str, labels: dict):
        base = url.rstrip("/")
        self.url = base if base.endswith("/ingest") else base + "/ingest"
        self.labels, self.endpoint = labels, self.url

    def part(self, cap, rep, symbolizer, start_ns: int, end_ns: int):
        return profile(cap, rep, symbolizer), cap.meta, start_ns // 10**9, end_ns // 10**9

    def build(self, parts: list) -> list:
        out = []
        for data, meta, start_s, end_s in parts:
            body, content_type = multipart({
                "profile": ("profile.pprof", data),
                "sample_type_config": ("sample_type_config.json",
                                       json.dumps(SAMPLE_TYPE_CONFIG).encode())})
            out.append((ingest_url(self.url, meta, self.labels, start_s, max(end_s, start_s + 1)),
                        body, content_type))
        return out

    def send(self, payload) -> None:
        url, body, content_type = payload
        post(url, body, content_type, TIMEOUT_S)
