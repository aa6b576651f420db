"""Leaks proven by reachability (issue 44): which outstanding blocks no pointer reaches, in the
running process. check.py takes the check (every thread stopped, the roots scanned, the blocks
marked: hook_cpp/reachability/); the reports read its per-stack categories."""
