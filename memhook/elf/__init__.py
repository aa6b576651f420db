"""The first stage: the target's objects read from their ELF files. slots finds every GOT slot
of a hooked function (hooks: the entry points the hook library has) and where the real functions
are; allocators finds allocators besides libc's and whether the slots reach them; module_files
keeps the target's files by build-id where this host cannot find them by path."""
