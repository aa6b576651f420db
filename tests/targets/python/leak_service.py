"""A command-driven Python service (tests/integration/test_python_frames.py): `leak` keeps 1,000
dicts (leak_module.leak_here), `churn` makes and frees as many, `threads` runs four
threads that each keep blocks from a function of their own, `exec` keeps blocks from code made
by exec() and then drops that code, `ext` calls a C extension that leaks through malloc,
`wait` has it keep a block and wait for wait.fifo to be opened and closed. Python 3.8 to 3.13; nothing but the standard library (and the extension, where built)."""
import gc
import sys
import threading
import tracemalloc

import leak_module

held = []


def churn():
    for _ in range(100):
        batch = [bytes(2000 + i) for i in range(10)]  # CHURN
        del batch


def thread_0(out):
    out.append(bytes(3000))  # THREAD 0


def thread_1(out):
    out.append(bytes(3100))  # THREAD 1


def thread_2(out):
    out.append(bytes(3200))  # THREAD 2


def thread_3(out):
    out.append(bytes(3300))  # THREAD 3


def threads():
    workers = [threading.Thread(target=f, args=(held,))
               for f in (thread_0, thread_1, thread_2, thread_3)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()


EXEC_SOURCE = """
def made_by_exec_{n}(out):
    out.append(bytes({size}))
made_by_exec_{n}(held)
"""


def run_exec():
    # Two code objects in turn, each dropped (and collected) before the next is made.
    for n, size in ((1, 4001), (2, 4002)):
        exec(EXEC_SOURCE.format(n=n, size=size), {"held": held})
        gc.collect()


def call_extension():
    import leak_ext
    leak_ext.leak(5000)  # EXTENSION


def call_and_wait():
    import leak_ext
    leak_ext.keep_and_wait(6000, "wait.fifo")  # WAIT


def handle(command):
    if command == "leak":
        leak_module.leak_here(held)  # HANDLE
    elif command == "churn":
        churn()
    elif command == "threads":
        threads()
    elif command == "exec":
        run_exec()
    elif command == "ext":
        call_extension()
    elif command == "wait":
        call_and_wait()
    elif command == "stats":
        # What tracemalloc saw of leak_here's line, and the exact bytes of what it kept.
        stat = next((s for s in tracemalloc.take_snapshot().statistics("lineno")
                     if s.traceback[0].filename.endswith("leak_module.py")
                     and s.traceback[0].lineno == leak_module.LEAK_LINE), None)
        kept = [d for d in held if type(d) is dict]
        print(f"stats tracemalloc {stat.size if stat else 0} {stat.count if stat else 0} "
              f"kept {len(kept)}", flush=True)


def main():
    if "--tracemalloc" in sys.argv:
        tracemalloc.start()
    print("ready", flush=True)
    for line in sys.stdin:
        command = line.strip()
        if command == "exit":
            break
        handle(command)  # MAIN
        print("done", flush=True)


main()
