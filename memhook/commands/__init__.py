"""The commands: `memhook -p PID` (attach.py), `memhook run -- CMD` (launch.py), `memhook report
FILE` (report.py), `memhook snapshot PID` (snapshot.py), `memhook leaks -p PID` (leaks.py) and
`memhook trim -p PID` (trim.py). Attach, run and leaks all go through driver.py, the one run
driver, which shows the live view (live_view.py) while a run lasts."""
