"""The capture: what a session saw, raw (return addresses, never symbols), to report on later,
on this host or another. format.py is the file's layout and the in-memory Capture; writer.py
and reader.py put it on disk and read it back; recorder.py follows a live session; merge.py
makes several processes' captures one."""
# The columns and Capture, as every stage names them.
from .format import (MAGIC, VERSION, HEADER, BLOCK, MAX_BLOCK, MAX_PROCESSES, SITE_COLUMNS,
                     UNCERTAIN_COLUMNS, PEAK_COLUMNS, SERIES_COLUMNS, MEMORY_COLUMNS, PART_COLUMNS,
                     LIVE_COLUMNS,
                     BEHAVIOUR_ROWS, BEHAVIOUR_HISTS, BEHAVIOUR_LATER_HISTS, BEHAVIOUR_PAIRS,
                     TOP_STACKS, TICK_CHUNKS, EVENT_DTYPE, Capture, CaptureError)
from .merge import merge, module_key, stack_key
from .reader import read, read_processes


def __getattr__(name: str):
    """The live session's recorder and the file writer, imported when first named: a report
    needs neither (their imports were a tenth of memhook's own import time in one)."""
    if name in ("Recorder", "current", "module_table"):
        from . import recorder
        return getattr(recorder, name)
    if name in ("SharedWriter", "Writer", "write"):
        from . import writer
        return getattr(writer, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["MAGIC", "VERSION", "HEADER", "BLOCK", "MAX_BLOCK", "MAX_PROCESSES", "SITE_COLUMNS",
           "UNCERTAIN_COLUMNS", "PEAK_COLUMNS", "SERIES_COLUMNS", "MEMORY_COLUMNS", "PART_COLUMNS", "LIVE_COLUMNS",
           "BEHAVIOUR_ROWS", "BEHAVIOUR_HISTS", "BEHAVIOUR_LATER_HISTS", "BEHAVIOUR_PAIRS",
           "TOP_STACKS", "TICK_CHUNKS", "EVENT_DTYPE", "Capture", "CaptureError", "Recorder",
           "SharedWriter", "Writer", "current", "merge", "module_key", "module_table", "read",
           "read_processes", "stack_key", "write"]
