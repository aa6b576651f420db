"""The two commands: `memhook -p PID` (attach.py) and `memhook report FILE` (report.py)."""
