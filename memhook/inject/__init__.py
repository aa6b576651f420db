"""Ways into the target: how the hook library gets loaded and the slots patched (and put back).
requests.py says what is asked (AttachRequest, DetachRequest); each way in answers it with the
same result (patched and skipped slots, the library's base, the pause). gdb.py is the way in
today (gdb_agent.py runs inside GDB); a second one (launch, preload) is a class beside it with
the same attach() and detach(). target_files.py places the segment and the library copy where
the target can open them."""
from __future__ import annotations

from typing import Protocol

from .requests import AttachRequest, DetachRequest


class WayIn(Protocol):
    name: str

    def attach(self, request: AttachRequest) -> dict:
        """Load (or reuse) the hook library, memhook_start, patch; the result, or {"error"}."""

    def detach(self, request: DetachRequest) -> dict:
        """Hooks to pass-throughs, every slot that holds its hook put back."""
