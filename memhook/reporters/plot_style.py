"""What the plots share with code that does not import matplotlib (the HTML page, the child that
draws the plots beside the model: plots_beside.py)."""

STACKS_SHOWN = 8  # stacks (or processes) a plot names; the rest are "other stacks"

# The resident memory's kinds of part (resident.py), one colour each: the same in the plots and
# in the HTML page's bar.
KIND_COLOURS = {"heap": "#e8864a", "arena": "#f2b07f", "mmapped": "#d9b36b", "mmap": "#5b8fd1",
                "anonymous": "#9dbbe3", "stack": "#8cc67c", "file": "#b5b5b5",
                "shared": "#c49ad8", "memhook": "#e06666", "kernel": "#dddddd"}
