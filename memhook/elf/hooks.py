"""The hooked entry points, as compiled into the hook library (hook_cpp/common/hooks.def)."""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from .. import _native


@dataclass(frozen=True)
class Hook:
    id: int
    symbol: str  # the ELF symbol whose slots are patched
    name: str    # what reports call the operation
    kind: str    # A allocates, F frees, R reallocates, L dynamic loader, M U D X the program's
                 # own mappings, P exec (hooks.def)
    bit: int     # its operation's bit in a site's op mask (hook_cpp/common/operations.h)


HOOKS = [Hook(*h) for h in _native.hooks()]
BY_ID = {h.id: h for h in HOOKS}
BY_SYMBOL = {h.symbol: h for h in HOOKS}


OPERATIONS = {}  # op-mask bit -> the operation's name (malloc, je_malloc: one operation)
for _h in HOOKS:
    if _h.bit:  # (exec and spawn rows have none)
        OPERATIONS.setdefault(_h.bit, _h.name)


def operation_names(mask: int) -> list[str]:
    """The operations set in a consumer op mask (a report asks for every site's: few masks)."""
    return list(_operation_names(mask))


@lru_cache(maxsize=1024)
def _operation_names(mask: int) -> tuple[str, ...]:
    return tuple(OPERATIONS[b] for b in sorted(OPERATIONS) if mask >> b & 1)


def entry_symbol(symbol: str, sample_rate: int, size_filter: bool) -> str:
    """The hook library's function a slot of `symbol` is pointed at (hook_cpp/common/routing.h,
    the table the hook library uses for libraries loaded later)."""
    return _native.entry_symbol(symbol, sample_rate, size_filter)
