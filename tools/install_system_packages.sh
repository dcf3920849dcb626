#!/usr/bin/env bash
# Installs the Debian packages the checks need, when they are missing and we may:
# as root with apt-get (as in CI). Elsewhere it says what is missing; the tests
# that need it are then skipped with that reason.
set -euo pipefail

# macOS: nothing to install. The SLURM cluster is Linux-only (Debian's packages, /usr/sbin
# daemons) and the browser check needs Chromium; their checks skip, the labs need neither.
if [ "$(uname -s)" = Darwin ]; then
  echo "note: macOS, nothing to install: the one-machine SLURM cluster (slurm-wlm, munge)" \
       "runs on Linux only, and the browser check skips without Chromium;" \
       "the labs need neither (docs/start/mac.md)" >&2
  exit 0
fi

need=()
command -v chromium >/dev/null 2>&1 || need+=(chromium)
# the one-machine SLURM cluster (tools/slurm/cluster.sh); the daemons live in /usr/sbin
[ -x /usr/sbin/slurmctld ] || command -v slurmctld >/dev/null 2>&1 || need+=(slurm-wlm)
[ -x /usr/sbin/munged ] || command -v munged >/dev/null 2>&1 || need+=(munge)

if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing Debian packages: ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" fonts-dejavu-core >/dev/null
else
  echo "note: missing ${need[*]} (install them with your package manager);" \
       "the checks that need them will be skipped" >&2
fi
