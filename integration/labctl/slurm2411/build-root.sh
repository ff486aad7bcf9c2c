#!/bin/bash
# Build a minimal Debian 13 (trixie) root with Slurm 24.11 at $ROOT.
# (The measured run installed libffi8 libnsl2 libtirpc3t64 in a second apt-get call, 1.9 s.)
# The mirror is taken from the host's apt sources (first "URIs:" or "deb" line for .../debian).
set -euo pipefail
ROOT=${ROOT:?set ROOT to the directory the trixie root goes in (not under /tmp)}
host_mirror() {  # first Debian archive URI in the host's apt sources
  { cat /etc/apt/sources.list /etc/apt/sources.list.d/*.sources /etc/apt/sources.list.d/*.list 2>/dev/null || true; } \
    | grep -E '^(URIs:|deb )' | grep -oE 'https?://[^ ]+/debian/?( |$)' | head -1 | tr -d ' '
}
MIRROR=${MIRROR:-$(host_mirror)}
echo "mirror taken from host apt sources"
T0=$(date +%s)
nice -n 19 ionice -c3 debootstrap --variant=minbase trixie "$ROOT" "$MIRROR"
T1=$(date +%s)
# no service may start inside the root
printf '#!/bin/sh\nexit 101\n' > "$ROOT/usr/sbin/policy-rc.d"; chmod 755 "$ROOT/usr/sbin/policy-rc.d"
# chroot needs /proc for some maintainer scripts; use a private mount namespace so nothing leaks
nice -n 19 ionice -c3 unshare -m --propagation private sh -c "
  mount -t proc proc '$ROOT/proc'
  chroot '$ROOT' env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      slurmctld slurmd slurm-client slurmdbd munge \
      libffi8 libnsl2 libtirpc3t64   # for the host venv's python (ctypes -> ray; nis)
  chroot '$ROOT' apt-get clean
"
T2=$(date +%s)
[ -e "$ROOT/etc/hosts" ] || printf '127.0.0.1 localhost\n' > "$ROOT/etc/hosts"   # minbase has none; a bind target
echo "debootstrap: $((T1 - T0)) s; apt-get install: $((T2 - T1)) s"
du -sh "$ROOT"
