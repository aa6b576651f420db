"""The commands: `memhook -p PID` (attach.py), `memhook run -- CMD` (launch.py), `memhook report
FILE` (report.py), `memhook snapshot PID` (snapshot.py) and `memhook trim -p PID` (trim.py)."""
