"""Live pushes: the Pusher (pusher.py) sends profiles every interval to a sink (sinks.py), each
through one HTTP POST (http.py)."""
from .http import PushError
from .pusher import Pusher
from .sinks import OtlpSink, PyroscopeSink, endpoint, push

__all__ = ["OtlpSink", "PushError", "Pusher", "PyroscopeSink", "endpoint", "push"]
