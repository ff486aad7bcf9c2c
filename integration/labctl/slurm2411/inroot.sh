#!/bin/bash
# Run a command inside the trixie root, in a private mount namespace (nothing leaks to the host;
# every mount dies with the namespace), with the paths jobs need bind-mounted at the same place.
#   NET=host|none  (default none: an empty network namespace, so nothing can reach any daemon)
set -euo pipefail
ROOT=${ROOT:?set ROOT to the directory the trixie root goes in (not under /tmp)}
BINDS=${BINDS:?list the paths to bind, e.g. "/work/main:ro /root/.pyenv:ro"}
NETFLAG=-n; [ "${NET:-none}" = host ] && NETFLAG=
exec unshare -m $NETFLAG --propagation private env ROOT="$ROOT" BINDS="$BINDS" bash -c '
  set -e
  mount -t proc proc "$ROOT/proc"
  mount --rbind /sys "$ROOT/sys"
  mount --rbind /dev "$ROOT/dev"
  mount -t tmpfs tmpfs "$ROOT/tmp"
  for b in $BINDS; do
    src=${b%:*}; mode=${b##*:}
    mkdir -p "$ROOT$src"
    mount --bind "$src" "$ROOT$src"
    [ "$mode" = ro ] && mount -o remount,bind,ro "$ROOT$src"
  done
  [ -n "${IN_NS_HOOK:-}" ] && eval "$IN_NS_HOOK"
  exec chroot "$ROOT" "$@"
' inroot "$@"
