"""How long memhook stops real programs: Debian's redis-server, memcached, an nginx worker, a
PostgreSQL backend and python3.11, each answering a client that asks it something in a tight loop.

Each cycle starts the program afresh (so every attach loads the hook library, as a first attach
does), lets the client run 0.3 s (the baseline: its longest round trip with no memhook), attaches
memhook, lets it trace 0.5 s and detaches it with SIGINT. The pause as the program's clients see
it is the client's longest round trip while memhook attaches (or detaches), less nothing: it
includes the client's own scheduling noise, which the baseline shows. memhook's own figure (from
GDB's ptrace attach to its detach, less the time the target ran while GDB waited for a thread to
enter malloc) is printed beside it.

    sudo .venv/bin/python benchmarks/real_pause.py [--cycles 5] [--only redis,nginx]

Programs that are not installed are skipped (Debian: apt-get install redis-server memcached
nginx postgresql).
"""
import argparse
import os
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from driver import NO_LEAK_CHECK, Session, free_port

PY_SERVER = r"""
import socket, sys, threading
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen()
def serve(c):
    keep = []
    while True:
        d = c.recv(64)
        if not d:
            return
        keep.append(bytearray(200))  # the interpreter allocates per request
        del keep[:-100]
        c.sendall(d)
def accept():
    while True:
        threading.Thread(target=serve, args=(s.accept()[0],), daemon=True).start()
threading.Thread(target=accept, daemon=True).start()
threading.Event().wait()
"""


def connect(port: int, timeout: float = 10.0) -> socket.socket:
    end = time.monotonic() + timeout
    while True:
        try:
            c = socket.create_connection(("127.0.0.1", port), timeout=5)
            c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return c
        except OSError:
            if time.monotonic() > end:
                raise
            time.sleep(0.05)


def read_until(c: socket.socket, done) -> bytes:
    buf = b""
    while not done(buf):
        d = c.recv(4096)
        if not d:
            raise ConnectionError("the program closed the connection")
        buf += d
    return buf


class Program:
    """One run of a real program, a connected client, and the PID memhook attaches to."""
    name = ""

    def __init__(self, tmp: Path):
        self.tmp, self.port = tmp, free_port()
        self.proc = subprocess.Popen(self.argv(), stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True)
        self.conn = connect(self.port)
        self.pid = self.target_pid()

    def target_pid(self) -> int:
        return self.proc.pid

    def close(self):
        self.conn.close()
        try:
            os.killpg(self.proc.pid, 9)
        except ProcessLookupError:
            pass
        self.proc.wait()


class Redis(Program):
    name, binary = "redis-server", "redis-server"

    def argv(self):
        return [self.binary, "--port", str(self.port), "--save", "", "--appendonly", "no"]

    def ask(self):
        self.conn.sendall(b"PING\r\n")
        read_until(self.conn, lambda b: b.endswith(b"\r\n"))


class Memcached(Program):
    name, binary = "memcached", "memcached"

    def argv(self):
        return [self.binary, "-p", str(self.port), "-U", "0", "-l", "127.0.0.1", "-u", "nobody"]

    def ask(self):
        self.conn.sendall(b"set k 0 0 5\r\nhello\r\nget k\r\n")
        read_until(self.conn, lambda b: b.endswith(b"END\r\n"))


class Nginx(Program):
    name, binary = "nginx worker", "nginx"

    def argv(self):
        conf = self.tmp / "nginx.conf"
        conf.write_text(f"""daemon off; master_process on; worker_processes 1;
pid {self.tmp}/nginx.pid; error_log {self.tmp}/error.log;
events {{ worker_connections 64; }}
http {{ access_log off; keepalive_requests 100000000;
  server {{ listen 127.0.0.1:{self.port}; location / {{ return 200 "ok\\n"; }} }} }}
""")
        return [self.binary, "-p", str(self.tmp), "-c", str(conf)]

    def target_pid(self):
        kids = subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True,
                              text=True).stdout.split()
        return int(kids[0])

    def ask(self):
        self.conn.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        read_until(self.conn, lambda b: b.endswith(b"ok\n"))


class Postgres(Program):
    """A backend: the process that serves the client's own connection."""
    name, binary = "postgres backend", "/usr/lib/postgresql/15/bin/postgres"

    def argv(self):
        data = self.tmp / "pgdata"
        if not data.exists():
            shutil.chown(self.tmp, "postgres")
            subprocess.run(["runuser", "-u", "postgres", "--", str(Path(self.binary).parent / "initdb"),
                            "-D", str(data), "-A", "trust", "-U", "postgres"],
                           check=True, capture_output=True)
        return ["runuser", "-u", "postgres", "--", self.binary, "-D", str(data), "-p",
                str(self.port), "-k", str(self.tmp), "-c", "listen_addresses=127.0.0.1"]

    def target_pid(self):
        user = b"user\0postgres\0database\0postgres\0\0"
        body = struct.pack("!I", 196608) + user
        self.conn.sendall(struct.pack("!I", len(body) + 4) + body)
        self.rf = self.conn.makefile("rb")
        pid = None
        while True:
            kind, n = struct.unpack("!cI", self.rf.read(5))
            payload = self.rf.read(n - 4)
            if kind == b"K":
                pid = struct.unpack("!I", payload[:4])[0]
            if kind == b"Z":
                return pid
            if kind == b"E":
                raise RuntimeError(payload.decode(errors="replace"))

    def ask(self):
        q = b"SELECT 1\0"
        self.conn.sendall(b"Q" + struct.pack("!I", len(q) + 4) + q)
        while True:
            kind, n = struct.unpack("!cI", self.rf.read(5))
            self.rf.read(n - 4)
            if kind == b"Z":
                return

    def close(self):
        self.conn.close()
        self.proc.terminate()  # postgres' own shutdown: its children go with it
        self.proc.wait()


class Python(Program):
    name, binary = "python3.11", "/usr/bin/python3.11"

    def argv(self):
        return [self.binary, "-c", PY_SERVER, str(self.port)]

    def ask(self):
        self.conn.sendall(b"ping\n")
        read_until(self.conn, lambda b: b.endswith(b"ping\n"))


class Client(threading.Thread):
    """Asks the program in a tight loop; keeps every round trip's (end, duration)."""

    def __init__(self, program: Program):
        super().__init__(daemon=True)
        self.program, self.trips, self.stopping = program, [], False

    def run(self):
        while not self.stopping:
            t0 = time.monotonic()
            self.program.ask()
            t1 = time.monotonic()
            self.trips.append((t1, t1 - t0))

    def longest(self, t0: float, t1: float) -> float:
        """The longest round trip that overlaps [t0, t1], in ms."""
        return max((d for end, d in self.trips if end >= t0 and end - d <= t1), default=0) * 1e3


def cycle(cls, tmp: Path) -> dict:
    prog = cls(tmp)
    client = Client(prog)
    try:
        client.start()
        t = time.monotonic()
        time.sleep(0.3)
        out = {"baseline": client.longest(t, time.monotonic())}
        t = time.monotonic()
        mh = Session(prog.pid, *NO_LEAK_CHECK)
        out["attach"] = client.longest(t, time.monotonic())
        out["attach_told"] = mh.attach_ms
        time.sleep(0.5)
        t = time.monotonic()
        mh.stop()
        out["detach"] = client.longest(t, time.monotonic())
        out["detach_told"] = mh.detach_ms
        client.stopping = True
        client.join(5)
        return out
    finally:
        prog.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=5)
    ap.add_argument("--only", default="", help="comma-separated: redis,memcached,nginx,postgres,python")
    a = ap.parse_args()
    programs = {"redis": Redis, "memcached": Memcached, "nginx": Nginx, "postgres": Postgres,
                "python": Python}
    chosen = [programs[k] for k in (a.only.split(",") if a.only else programs)]
    print(f"{'program':18} {'baseline max':>13} {'attach: seen':>13} {'told':>7}"
          f" {'detach: seen':>13} {'told':>7}   (medians of {a.cycles}, max in brackets, ms)")
    for cls in chosen:
        if not shutil.which(cls.binary):
            print(f"{cls.name:18} not installed")
            continue
        runs = []
        for _ in range(a.cycles):
            with tempfile.TemporaryDirectory(prefix="memhook-pause-") as tmp:
                os.chmod(tmp, 0o755)
                runs.append(cycle(cls, Path(tmp)))

        def col(k):
            xs = [r[k] for r in runs]
            return f"{statistics.median(xs):5.1f} [{max(xs):5.1f}]"
        print(f"{cls.name:18} {col('baseline'):>13} {col('attach'):>13} {col('attach_told'):>7}"
              f" {col('detach'):>13} {col('detach_told'):>7}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
