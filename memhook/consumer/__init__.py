"""After the hooks, the rings: a session attaches (inject/), drains the rings through the native
consumer (hook_cpp/consumer/, memhook._native) and detaches (session). Beside it, what is read
of the target while it runs: its heap before attach (heap_census), its allocator's statistics
(allocator_stats), and the conditions that take a snapshot (snapshot_when)."""
