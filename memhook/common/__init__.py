"""What every stage shares: what /proc says of the target (procfs, resident), the processor's
table (arch), memhook's caches on disk (disk_cache), and the words for numbers and frames every
view uses (format, with attribution's leak frame and short_names' C++ names)."""
