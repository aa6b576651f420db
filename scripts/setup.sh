#!/usr/bin/env bash
# Everything memhook needs on a fresh Debian/Ubuntu machine: system tools (gdb, a C++ compiler),
# a virtual environment in .venv, and memhook built and installed into it with its test extras.
set -euo pipefail
cd "$(dirname "$0")/.."

as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

missing=()
command -v gdb >/dev/null || missing+=(gdb)
command -v g++ >/dev/null || missing+=(g++)
command -v cmake >/dev/null || missing+=(cmake)
python3 -c 'import venv, ensurepip' 2>/dev/null || missing+=(python3-venv)
# elfutils' libdw: memhook reads the targets' call-frame information with it.
command -v pkg-config >/dev/null || missing+=(pkg-config)
pkg-config --exists libdw libelf 2>/dev/null || missing+=(libdw-dev libelf-dev)
# For the test suite: a musl target (memhook must refuse it clearly) and a traced target.
command -v musl-gcc >/dev/null || missing+=(musl-tools)
command -v strace >/dev/null || missing+=(strace)
# For the test of a foreign-architecture target (an aarch64 program under qemu-user).
command -v qemu-aarch64-static >/dev/null || missing+=(qemu-user-static)
# For the tests of allocators besides glibc's: jemalloc's and tcmalloc's static libraries,
# mimalloc's shared one, and cargo for the Rust targets.
[ -e /usr/lib/x86_64-linux-gnu/libjemalloc.a ] || missing+=(libjemalloc-dev)
[ -e /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.a ] || missing+=(libgoogle-perftools-dev)
[ -e /usr/lib/x86_64-linux-gnu/libmimalloc.so ] || missing+=(libmimalloc-dev)
command -v cargo >/dev/null || missing+=(cargo)
# For the wheels (scripts/wheels.sh): elfutils' build generates code with m4, bison and flex.
if [ "${1:-}" = --tests ]; then
  for tool in m4 bison flex; do command -v $tool >/dev/null || missing+=($tool); done
fi
# For the tests of other glibcs: Debian root file systems (scripts/roots.sh).
command -v debootstrap >/dev/null || missing+=(debootstrap)
# For the test of the HTML report as a browser shows it.
command -v chromium >/dev/null || missing+=(chromium)
# For the leak check's ground truth: valgrind, and LeakSanitizer (clang and its runtime).
command -v valgrind >/dev/null || missing+=(valgrind)
command -v clang-14 >/dev/null || missing+=(clang-14)
compgen -G "/usr/lib/llvm-14/lib/clang/*/lib/linux/libclang_rt.lsan-x86_64.a" >/dev/null ||
  missing+=(libclang-rt-14-dev)
if [ "${1:-}" = --tests ]; then
  # For the test of a JVM leaking through java.util.zip.Deflater (a JIT's frames, HotSpot's).
  command -v javac >/dev/null || missing+=(openjdk-17-jdk-headless)
  # For the census of every PostgreSQL process under pgbench (benchmarks/pgbench_pause.py too).
  [ -x /usr/lib/postgresql/15/bin/pgbench ] || missing+=(postgresql-15)
  # For Python and JIT frames (tests/integration/test_python_frames.py, test_jit_frames.py):
  # Debian's debug build of Python (refused in one line) and Node.js (its perf map).
  [ -x /usr/bin/python3.11d ] || missing+=(python3.11-dbg)
  command -v node >/dev/null || missing+=(nodejs)
  # For the native unit tier on AArch64 (tests/unit/test_native.py): cross-built, run under
  # qemu-user (issue 46; the emulated machine is scripts/arm64.sh's).
  command -v aarch64-linux-gnu-g++ >/dev/null || missing+=(g++-aarch64-linux-gnu)
  command -v qemu-aarch64-static >/dev/null || missing+=(qemu-user-static)
  # The musl hook library for AArch64, cross-built against Debian's musl for arm64 (multiarch).
  if [ ! -e /usr/lib/aarch64-linux-musl/musl-gcc.specs ]; then
    dpkg --print-foreign-architectures | grep -qx arm64 || as_root dpkg --add-architecture arm64
    missing+=(musl-dev:arm64)
  fi
fi
# For benchmarks/real_program.py: a real program under its own workload.
command -v sqlite3 >/dev/null || missing+=(sqlite3)
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

[ -x .venv/bin/python ] || python3 -m venv .venv

# With --tests, what only the test suite needs is built side by side with memhook itself (most of
# it waits on the network or on one core): each job logs to .venv/setup-JOB.log, and set-up
# fails, with the log's end, if any job fails.
declare -A jobs=()
job() {  # job NAME COMMAND...: run in the background, timed; all but the wheels (the longest,
  local name=$1; shift  # elfutils first) at nice 10, so that they take the cores the wheels leave
  ( [ "$name" = wheels ] || renice -n 10 -p $BASHPID >/dev/null
    t0=$SECONDS; "$@" && rc=0 || rc=$?; echo "setup: $name: exit $rc after $(( SECONDS - t0 )) s"; exit $rc ) \
    > ".venv/setup-$name.log" 2>&1 &
  jobs[$name]=$!
}

# For the OTLP tests: an OpenTelemetry Collector built once with the Collector Builder from the Go
# module proxy (about two minutes), kept in .venv/otelcol.
otelcol=.venv/otelcol/otelcol-memhook
go=$(command -v go || echo /usr/local/go/bin/go)
build_otelcol() {
  mkdir -p .venv/otelcol
  GOBIN="$PWD/.venv/otelcol" "$go" install go.opentelemetry.io/collector/cmd/builder@v0.165.0 &&
  sed "s|^dist:|dist:\n  output_path: $PWD/.venv/otelcol/build|" scripts/otelcol-builder.yaml \
    > .venv/otelcol/builder.yaml &&
  .venv/otelcol/builder --config .venv/otelcol/builder.yaml &&
  cp .venv/otelcol/build/otelcol-memhook "$otelcol"
}
if [ "${1:-}" = --tests ]; then
  if [ -x "$otelcol" ]; then :
  elif [ -x "$go" ]; then job otelcol build_otelcol
  else echo "setup: no Go toolchain: the OTLP tests will be skipped"
  fi
  # For the tests of other glibcs and of the wheels on bare hosts: Debian 11 and 13 roots, built
  # once (a few minutes) and cached in /var/cache/memhook-roots.
  job roots as_root scripts/roots.sh
  # For the wheel tests: a wheel for each CPython 3.9-3.13 (scripts/wheels.sh; its static
  # elfutils built once, about three minutes, then cached; then about 20 s a wheel).
  job wheels scripts/wheels.sh
  # For the Rust tests (tests/integration/test_allocators.py): tests/targets/rust_leaks built once
  # (its crates fetched by cargo, about a minute), kept in /var/cache/memhook-rust.
  job rust env CARGO_TARGET_DIR=/var/cache/memhook-rust/target cargo build -q --release --locked \
    --manifest-path tests/targets/rust_leaks/Cargo.toml
fi
nice -n 10 .venv/bin/python -m pip install -q --upgrade pip  # (beside the wheels: they go first)
nice -n 10 .venv/bin/python -m pip install -q ".[test]"
echo "setup: memhook installed in .venv ($(.venv/bin/memhook --version))"
failed=0
for name in "${!jobs[@]}"; do
  if wait "${jobs[$name]}"; then
    tail -1 ".venv/setup-$name.log"
  else
    echo "setup: $name failed; the end of .venv/setup-$name.log:" >&2
    tail -20 ".venv/setup-$name.log" >&2
    failed=1
  fi
done
exit $failed
