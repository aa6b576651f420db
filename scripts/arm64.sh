#!/usr/bin/env bash
# The arm64 tier's machine (issue 46): Debian 12 for arm64, emulated by qemu-system-aarch64 on
# this x86-64 host, with its own gcc, gdb and python3.
#
#   scripts/arm64.sh build          the root, its kernel, a small initramfs and a disk image, built
#                                   once (mmdebstrap under qemu-user, about 5 minutes) and cached
#                                   in $MEMHOOK_ROOTS/arm64 (/var/cache/memhook-roots/arm64)
#   scripts/arm64.sh run DIR        boot it with DIR shared at /host, run DIR/guest.sh there as
#                                   root, power off; its output is DIR/guest.out, its exit
#                                   status DIR/guest.rc (none: the guest never got to the end)
#   scripts/arm64.sh stage DIR      memhook cross-built as the tier builds it, in DIR/pkg (for
#                                   a probe: PYTHONPATH=/host/pkg in DIR/guest.sh)
#   scripts/arm64.sh test [ARGS]    the arm64 tier: memhook cross-built on this host against the
#                                   root (scripts/aarch64-toolchain.cmake), then the tests marked
#                                   arm64 run in the guest by its own python3 (pytest ARGS too),
#                                   their targets compiled there by its gcc; pytest's output,
#                                   ending with its summary line, and its exit status
#
# The guest boots with an init script of ours instead of systemd (a test starts about 10 s after
# launch), from the disk image in snapshot mode (nothing it writes outlives the boot), two cores,
# 4 GiB. `-cpu max,pauth-impdef=on` was the fastest CPU model (plain `max` 1.6x slower); it turns
# pointer authentication on, as Graviton 3 and Ampere One have it.
set -euo pipefail
cache=${MEMHOOK_ROOTS:-/var/cache/memhook-roots}/arm64
suite=bookworm
# The guest's own compiler, gdb and Python, with what memhook and its tests import (Debian's
# packages: the guest has no network); libdw-dev and python3-dev make the root the sysroot the
# host cross-builds memhook against (kept beside the disk as root/).
packages=linux-image-arm64,mount,mawk,gcc,g++,libc6-dev,gdb,python3,kmod,procps
packages+=,python3-pyelftools,python3-numpy,python3-pytest,python3-venv,libdw-dev,libelf-dev
packages+=,python3-dev,python3-capstone,libjemalloc-dev,python3-matplotlib,valgrind,libc6-dbg
# musl's loader and musl-gcc, for the musl targets (memhook's musl build is cross-built).
packages+=,musl,musl-dev,musl-tools
# Modules the initramfs loads to reach the root; 9p's come from the root itself.
initramfs_modules="virtio_pci virtio_mmio virtio_blk ext4"
stamp="$suite $packages $initramfs_modules v2"

host_tools() {
  local need=()
  command -v qemu-system-aarch64 > /dev/null || need+=(qemu-system-arm)
  command -v mmdebstrap > /dev/null || need+=(mmdebstrap)
  command -v qemu-aarch64-static > /dev/null || need+=(qemu-user-static)
  command -v update-binfmts > /dev/null || need+=(binfmt-support)
  command -v mkfs.ext4 > /dev/null || need+=(e2fsprogs)
  command -v aarch64-linux-gnu-g++ > /dev/null || need+=(g++-aarch64-linux-gnu)
  # (memhook's musl build for the guest: Debian's musl for arm64 beside the host's, multiarch)
  if [ ! -e /usr/lib/aarch64-linux-musl/musl-gcc.specs ]; then
    dpkg --print-foreign-architectures | grep -qx arm64 || dpkg --add-architecture arm64
    need+=(musl-dev:arm64)
  fi
  if [ ${#need[@]} -gt 0 ]; then
    echo "arm64: installing ${need[*]}"
    apt-get update -q > /dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}" \
      > /dev/null
  fi
  # mmdebstrap runs the root's arm64 programs through binfmt_misc and qemu-user.
  if [ ! -e /proc/sys/fs/binfmt_misc/status ]; then
    mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
  fi
  [ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ] || update-binfmts --enable qemu-aarch64
}

build() {
  if [ "$(cat "$cache/stamp" 2>/dev/null)" = "$stamp" ]; then
    return 0
  fi
  host_tools
  local start work
  start=$(date +%s)
  mkdir -p "$(dirname "$cache")"
  work=$(mktemp -d "$(dirname "$cache")/.arm64.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  echo "arm64: building the root (mmdebstrap under qemu-user, a few minutes)"
  # The initramfs holds only what reaching the root needs (the kernel package builds it after
  # this hook has said so): Debian's default, every module, is ten times the size.
  if ! mmdebstrap --arch=arm64 --variant=apt --include="$packages" \
      --essential-hook='mkdir -p "$1/etc/initramfs-tools/conf.d" "$1/usr/share/initramfs-tools/modules.d" &&
        printf "MODULES=list\nCOMPRESS=gzip\n" > "$1/etc/initramfs-tools/conf.d/memhook"' \
      --essential-hook="printf '%s\n' $initramfs_modules > \"\$1/usr/share/initramfs-tools/modules.d/memhook\"" \
      --customize-hook='cat > "$1/memhook-init" <<"EOF"
#!/bin/sh
# The guest'"'"'s init (scripts/arm64.sh): mount what a test needs, run /host/guest.sh, power off.
export PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
mkdir -p /dev/pts /dev/shm /host
mount -t devpts devpts /dev/pts
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
mount -t tmpfs -o mode=1777 tmpfs /tmp
mount -t tmpfs tmpfs /run
hostname arm64
modprobe 9pnet_virtio 2>/dev/null
mount -t 9p -o trans=virtio,version=9p2000.L,msize=1048576 host /host
if [ -x /host/guest.sh ]; then
  (cd /host && ./guest.sh) > /host/guest.out 2>&1
  echo $? > /host/guest.rc
fi
sync
echo o > /proc/sysrq-trigger
sleep 30  # (power-off is asynchronous: init must not exit before it, or the kernel panics)
EOF
chmod 0755 "$1/memhook-init"' \
      --customize-hook='rm -f "$1/etc/machine-id"; apt-get -o RootDir="$1" clean || true' \
      "$suite" "$work/root" > "$work/mmdebstrap.log" 2>&1; then
    tail -20 "$work/mmdebstrap.log"
    return 1
  fi
  cp "$work"/root/boot/vmlinuz-* "$work/vmlinuz"
  cp "$work"/root/boot/initrd.img-* "$work/initrd.img"
  # The disk straight from the directory: no loop device, no mount.
  mkfs.ext4 -q -L root -d "$work/root" "$work/disk.raw" 6G
  rm -f "$work/mmdebstrap.log"
  echo "$stamp" > "$work/stamp"
  rm -rf "$cache"
  mv "$work" "$cache"
  trap - EXIT
  echo "arm64: ready in $(( $(date +%s) - start )) s ($(du -sh "$cache" | cut -f1) on disk)"
}

run() {
  local dir=$1 timeout=${MEMHOOK_ARM64_TIMEOUT:-5400}
  build
  command -v qemu-system-aarch64 > /dev/null || host_tools
  rm -f "$dir/guest.rc" "$dir/guest.out"
  timeout --foreground "$timeout" qemu-system-aarch64 -M virt -cpu max,pauth-impdef=on \
    -smp 2 -m 4096 -nographic -no-reboot -nic none \
    -kernel "$cache/vmlinuz" -initrd "$cache/initrd.img" \
    -append "root=/dev/vda rw console=ttyAMA0 panic=-1 quiet init=/memhook-init" \
    -drive "file=$cache/disk.raw,if=virtio,format=raw,snapshot=on" \
    -virtfs "local,path=$dir,mount_tag=host,security_model=none" \
    > "$dir/console.log" 2>&1 || true
  if [ ! -e "$dir/guest.rc" ]; then
    echo "arm64: the guest did not finish (console: $dir/console.log)" >&2
    tail -20 "$dir/console.log" >&2
    return 1
  fi
  return "$(cat "$dir/guest.rc")"
}

# memhook for the guest: the hook library and the consumer module cross-built against the root
# (its libdw, its Python's headers), in a build folder kept beside the cache; the package staged
# in DIR/pkg as pip would install it.
cross_build() {
  local dir=$1 build=${MEMHOOK_ARM64_BUILD:-$(dirname "$cache")/arm64-build} tools
  tools=$(dirname "$cache")/arm64-tools
  host_tools
  [ -x "$tools/bin/python" ] || python3 -m venv "$tools"
  "$tools/bin/python" -c 'import pybind11' 2> /dev/null || "$tools/bin/pip" install -q pybind11
  MEMHOOK_SYSROOT=$cache/root cmake -S "$repo" -B "$build" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_TOOLCHAIN_FILE="$repo/scripts/aarch64-toolchain.cmake" \
    -Dpybind11_DIR="$("$tools/bin/python" -c 'import pybind11; print(pybind11.get_cmake_dir())')" \
    -DPython_INCLUDE_DIR="$cache/root/usr/include/python3.11" \
    -DPYTHON_MODULE_EXTENSION=.cpython-311-aarch64-linux-gnu.so > "$build.log" 2>&1 &&
  MEMHOOK_SYSROOT=$cache/root cmake --build "$build" -j "$(nproc)" >> "$build.log" 2>&1 || {
    tail -30 "$build.log" >&2
    return 1
  }
  mkdir -p "$dir/pkg"
  cp -r "$repo/memhook" "$dir/pkg/"
  cp "$build"/_native.*.so "$build/libmemhook_hook.so" "$dir/pkg/memhook/"
  mkdir -p "$dir/pkg/memhook/musl"
  cp "$build/musl/libmemhook_hook.so" "$dir/pkg/memhook/musl/"
}

tier() {
  build
  local dir status=0
  dir=$(mktemp -d /tmp/memhook-arm64.XXXXXX)
  trap 'rm -rf "$dir"' RETURN
  cross_build "$dir"
  # The wheel a user would install (test_wheels.py installs it in the guest).
  "$repo/scripts/wheels.sh" --arch aarch64 3.11 > "$dir/wheels.log" 2>&1 ||
    { tail -20 "$dir/wheels.log" >&2; return 1; }
  mkdir -p "$dir/wheelhouse"
  cp "$repo"/wheelhouse/memhook_profiler-*-cp311-*aarch64.whl "$dir/wheelhouse/"
  cp -r "$repo/tests" "$repo/pyproject.toml" "$dir/"
  : > "$dir/pytest-args"
  [ $# -eq 0 ] || printf '%s\n' "$@" > "$dir/pytest-args"
  cat > "$dir/guest.sh" <<"EOF"
#!/bin/sh
# In the guest: the tests marked arm64, by the guest's own python3, gcc and gdb.
export PYTHONPATH=/host/pkg PYTHONDONTWRITEBYTECODE=1 MEMHOOK_WHEELHOUSE=/host/wheelhouse
uname -m
cp -r /host/tests /host/pyproject.toml /tmp/
cd /tmp
xargs -d "\n" -a /host/pytest-args python3 -m pytest -p no:cacheprovider -m arm64 -rfE \
  $(grep -l "mark.arm64" tests/integration/*.py)
EOF
  chmod +x "$dir/guest.sh"
  run "$dir" || status=$?
  cat "$dir/guest.out" 2> /dev/null
  return $status
}

repo=$(cd "$(dirname "$0")/.." && pwd)
case ${1:-} in
  build) build ;;
  run) [ $# -eq 2 ] || { echo "usage: scripts/arm64.sh run DIR" >&2; exit 2; }; run "$2" ;;
  stage) [ $# -eq 2 ] || { echo "usage: scripts/arm64.sh stage DIR" >&2; exit 2; }
    build && cross_build "$2" ;;
  test) shift; tier "$@" ;;
  *) echo "usage: scripts/arm64.sh build | stage DIR | run DIR | test [PYTEST ARGS]" >&2; exit 2 ;;
esac
