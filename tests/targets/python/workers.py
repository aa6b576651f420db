"""A program whose forked worker keeps 1,000 dicts (tests/integration/test_python_frames.py:
memhook run --follow-fork names the worker's Python frames)."""
import multiprocessing

kept = []


def work_in_child(n):
    for i in range(n):
        kept.append({"worker": i, "name": f"w-{i}"})  # WORKER


def main():
    worker = multiprocessing.get_context("fork").Process(target=work_in_child, args=(1000,))
    worker.start()
    worker.join()
    print("worker exit code", worker.exitcode, flush=True)


if __name__ == "__main__":
    main()
