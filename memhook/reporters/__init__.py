"""Every report format from one capture: model.py builds the report (the JSON contract) from a
capture and its symbols; each format's module renders it with the same signature,
render(cap, report, symbolizer, **options) -> str | bytes. The `report` command, the final report
of a run and the live pushes all render through render() below. What the model reads besides
the capture: analysis.py (leak suspects, transients, histograms) and suppressions.py (known
leaks, in LeakSanitizer's format)."""
from __future__ import annotations

import importlib

# format -> its module (imported when first used: html and plots bring matplotlib, otlp the
# OpenTelemetry protobufs)
FORMATS = {"text": "text", "json": "model", "collapsed": "collapsed", "pprof": "pprof",
           "html": "html", "otlp": "otlp", "leaks": "leaks"}
BINARY = ("pprof", "otlp")


def render(fmt: str, cap, report: dict, symbolizer, **options):
    """`report` (model.build(cap, symbolizer, ...)) in format `fmt`. Options a format does not
    take are ignored: top (text), weight (collapsed), labels and filters (otlp)."""
    module = importlib.import_module(f"{__name__}.{FORMATS[fmt]}")
    return module.render(cap, report, symbolizer, **options)
