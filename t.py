import gdb, time
gdb.execute("file /proc/%d/exe" % PID, to_string=True)
gdb.execute("attach %d" % PID, to_string=True)
for i in range(3):
    t=time.monotonic(); sp=int(gdb.parse_and_eval("$sp")); t1=time.monotonic()
    gdb.execute("set $sp = %d" % (sp-4096)); t2=time.monotonic()
    gdb.execute("set $sp = %d" % sp); t3=time.monotonic()
    gdb.selected_inferior().write_memory(sp-8192, b"x"*64); t4=time.monotonic()
    print("read %.2f set %.2f set %.2f write %.2f ms" % ((t1-t)*1e3,(t2-t1)*1e3,(t3-t2)*1e3,(t4-t3)*1e3))
gdb.execute("detach")
