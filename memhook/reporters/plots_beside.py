"""The plots drawn in a child process beside the report's model. matplotlib's import (0.25 s)
and its drawing (0.2-0.5 s) were most of an HTML report's time, and the plots read little of
the model (its histograms and first suspects) and only at the end. Beside() forks once the
capture and its symbols are read; result(report) hands the child that little and returns
{figure name: image bytes}. Where no child can be made, or it fails or hangs, the plots are
drawn in this process instead: the same figures, later. Nothing here imports matplotlib."""
from __future__ import annotations

import gc
import os
import pickle
import select

from .plot_style import STACKS_SHOWN

# What the plots read of the report (plots.py): all of it is small.
PLOTTED = ("histograms", "processes", "leak_suspects")
WAIT_S = 60.0  # a child that has not answered by then is killed, and the plots drawn here


class Beside:
    def __init__(self, cap, symbolizer, fmt: str = "svg"):
        self.cap, self.symbolizer, self.fmt = cap, symbolizer, fmt
        self.pid = 0
        self.by_child = False  # (whether result()'s figures were the child's)
        # The child's collections leave alone what exists now: walking it would write to (and
        # so copy) every page of the capture's and the symbols' objects.
        gc.freeze()
        try:
            request_r, self.request = os.pipe()
            self.answer, answer_w = os.pipe()
            pid = os.fork()
        except OSError:
            gc.unfreeze()
            return
        if pid == 0:  # the child: it never returns into the caller's code
            code = 1
            try:
                os.close(self.request)
                os.close(self.answer)
                from . import plots
                with os.fdopen(request_r, "rb") as f:
                    report = pickle.load(f)
                figures = plots.render(cap, report, symbolizer, fmt)
                with os.fdopen(answer_w, "wb") as f:
                    pickle.dump(figures, f)
                code = 0
            finally:
                os._exit(code)
        gc.unfreeze()
        os.close(request_r)
        os.close(answer_w)
        self.pid = pid

    def ask(self, report: dict) -> None:
        """Hand the child what it plots of `report`; it draws while the caller goes on (the
        HTML page is written meanwhile). result() then collects the figures."""
        self.plotted = {k: report[k] for k in PLOTTED if k in report}
        if "leak_suspects" in self.plotted:
            self.plotted["leak_suspects"] = self.plotted["leak_suspects"][:STACKS_SHOWN]
        if self.pid:
            try:
                with os.fdopen(self.request, "wb") as f:
                    pickle.dump(self.plotted, f)
            except OSError:
                self._end(None)

    def result(self) -> dict:
        """{figure name: image bytes}, once ask() was: the child's, or drawn here if it gave
        none."""
        if self.pid:
            figures = None
            try:
                with os.fdopen(self.answer, "rb") as f:
                    if select.select([f], [], [], WAIT_S)[0]:
                        figures = pickle.load(f)
            except (OSError, EOFError, pickle.UnpicklingError):
                figures = None
            self._end(figures)
            if figures is not None:
                self.by_child = True
                return figures
        from . import plots
        return plots.render(self.cap, self.plotted, self.symbolizer, self.fmt)

    def _end(self, figures: dict | None) -> None:
        """The child reaped (killed first if it gave no figures)."""
        if figures is None:
            try:
                os.kill(self.pid, 9)
            except OSError:
                pass
        os.waitpid(self.pid, 0)
        self.pid = 0
