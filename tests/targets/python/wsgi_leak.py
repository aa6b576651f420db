"""A WSGI application whose /leak keeps 500 bytes objects per request in the worker that served it
(tests/integration/test_python_frames.py: gunicorn's workers under memhook run --follow-fork).
Each answer is the worker's PID and what tracemalloc (started in the worker by
gunicorn_leak.conf.py) says the leaking line holds: bytes, then blocks. (Bytes objects, not
dicts: CPython reuses freed dicts from a free list, and tracemalloc then moves the block's trace
to the line that reused it, where memhook, like every allocator-level tracer, keeps the line
that allocated it.)"""
import os
import tracemalloc

kept = []


def leak_in_view(n):
    for i in range(n):
        kept.append(bytes(64 + i % 64))  # VIEW


def held_by_the_view():
    snapshot = tracemalloc.take_snapshot().filter_traces(
        [tracemalloc.Filter(True, __file__, leak_in_view.__code__.co_firstlineno + 2)])
    stats = snapshot.statistics("lineno")
    return sum(s.size for s in stats), sum(s.count for s in stats)


def app(environ, start_response):
    if environ["PATH_INFO"] == "/leak":
        leak_in_view(500)
    size, count = held_by_the_view()
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [f"{os.getpid()} {size} {count}\n".encode()]
