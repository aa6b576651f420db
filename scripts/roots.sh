#!/usr/bin/env bash
# Debian root file systems for the tests of other glibcs (issue 31): Debian 11 "bullseye" (glibc
# 2.31) and Debian 13 "trixie" (2.41), each with its own compiler and gdb, built once with
# debootstrap from Debian's mirror and cached outside the checkout, in $MEMHOOK_ROOTS
# (/var/cache/memhook-roots). A root is built in a temporary directory and renamed into place when
# complete, so that an interrupted build is never taken for a cached one; its stamp names what it
# was built with, and a root built with other packages is built again.
# SUITE-bare (issue 42) is a production host's root: python3, python3-venv and gdb, no compiler
# and no -dev package; the wheel tests install memhook into it.
# Debian's mirror is debootstrap's default; MEMHOOK_MIRROR names another.
#   scripts/roots.sh [ROOT...]     (default: bullseye trixie bullseye-bare trixie-bare)
set -euo pipefail
cache=${MEMHOOK_ROOTS:-/var/cache/memhook-roots}
mirror=${MEMHOOK_MIRROR:-}
after=gdb  # by apt in the root: its dependencies fail to configure under debootstrap
[ $# -gt 0 ] || set -- bullseye trixie bullseye-bare trixie-bare
mkdir -p "$cache"
chmod 0755 "$cache"
# One root: built in a temporary directory, renamed into place when complete.
build_root() {
  local name=$1 suite=${1%-bare} packages root start work
  case $name in
    *-bare) packages=python3,python3-venv ;;
    *) packages=gcc,g++,libc6-dev ;;
  esac
  root=$cache/$name
  if [ "$(cat "$root/.memhook-root" 2>/dev/null)" = "$packages $after" ]; then
    return 0
  fi
  start=$(date +%s)
  echo "roots: building the $name root in $root (debootstrap, a few minutes)"
  work=$(mktemp -d "$cache/.$name.XXXXXX")
  if ! debootstrap --variant=minbase --include="$packages" "$suite" "$work" $mirror \
      > "$work.log" 2>&1; then
    tail -5 "$work.log"; rm -rf "$work" "$work.log"; return 1
  fi
  mount -t proc proc "$work/proc"
  if ! chroot "$work" apt-get install -y -q --no-install-recommends $after > "$work.log" 2>&1; then
    umount "$work/proc"; tail -5 "$work.log"; rm -rf "$work" "$work.log"; return 1
  fi
  umount "$work/proc"
  chroot "$work" apt-get clean
  echo "$packages $after" > "$work/.memhook-root"
  chmod 0755 "$work"
  rm -rf "$root" "$work.log"
  mv "$work" "$root"
  echo "roots: $name ready in $(( $(date +%s) - start )) s"
}

# The roots side by side: each mostly waits on the mirror and on dpkg, one core at a time.
pids=()
for name in "$@"; do
  build_root "$name" &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do
  wait "$pid" || status=1
done
exit $status
