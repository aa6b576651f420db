"""benchmarks/python_frames.py's workload, in the style of pyperformance's json and dict
benchmarks: dicts, strings, json.dumps and json.loads, called DEPTH Python frames deep. Prints
"ready", waits for "go" (or starts at once with --now), prints "elapsed SECONDS"."""
import json
import sys
import time


def nest(depth, work):
    return work() if depth == 0 else nest(depth - 1, work)


def work():
    out = []
    for i in range(20000):
        d = {"id": i, "name": f"n{i}", "tags": [i, i + 1, str(i)]}
        out.append(json.dumps(d))
    return [json.loads(s) for s in out]


def main():
    depth = int(sys.argv[1])
    if "--now" not in sys.argv:
        print("ready", flush=True)
        sys.stdin.readline()
    t = time.perf_counter()
    for _ in range(5):
        nest(depth, work)
    print(f"elapsed {time.perf_counter() - t:.4f}", flush=True)
    if "--now" not in sys.argv:
        sys.stdin.readline()  # (memhook stays attached until the end is read)


main()
