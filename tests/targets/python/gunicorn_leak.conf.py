"""gunicorn's configuration for wsgi_leak.py: tracemalloc in each worker from its fork, and a
worker that ends as a killed one would, without Python's finalization freeing the module's
list (so that what the requests kept is still held when memhook sees the worker exit)."""
import os
import tracemalloc


def post_fork(server, worker):
    tracemalloc.start()


def worker_exit(server, worker):
    os._exit(0)
