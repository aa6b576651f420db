import gdb, time
gdb.execute("file /proc/%d/exe" % PID, to_string=True)
gdb.execute("attach %d" % PID, to_string=True)
inf = gdb.selected_inferior()
sp = int(gdb.parse_and_eval("$sp"))
for variant in ("spaces", "zeros"):
    fill = b" " * 8192 if variant == "spaces" else b"\0" * 64 + b" " * 8128
    inf.write_memory(sp - 12288, fill)
    import os; os.stat("/tmp/MARK_" + variant)
    t = time.monotonic(); gdb.execute("set $sp = %d" % (sp - 12288)); t2 = time.monotonic()
    gdb.execute("set $sp = %d" % sp)
    print(variant, "set %.3f ms" % ((t2 - t) * 1e3))
gdb.execute("detach")
