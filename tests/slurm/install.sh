#!/usr/bin/env bash
# Install what the test Slurm cluster needs, from Debian's packages:
# munge, slurmctld, slurmd, the client commands, slurmdbd and MariaDB.
# Idempotent and quick when everything is there; starts no daemon
# (tests/slurm/cluster.sh does, under a private state directory).
set -euo pipefail

PACKAGES=(munge slurmctld slurmd slurm-client slurmdbd mariadb-server)

missing=()
for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$' || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
    echo "slurm install: already installed (${PACKAGES[*]})"
    exit 0
fi

if [ "$(id -u)" != 0 ]; then
    echo "slurm install: not root, nothing installed; missing: ${missing[*]} (run as root: bash tests/slurm/install.sh)"
    exit 0
fi
if ! command -v apt-get >/dev/null; then
    echo "slurm install: no apt-get here; install ${missing[*]} by hand"
    exit 0
fi

export DEBIAN_FRONTEND=noninteractive
# Keep package scripts from starting services (mariadb would): cluster.sh
# starts its own daemons. Only add the policy file if none exists, and remove
# only the one we added.
policy=/usr/sbin/policy-rc.d
if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy"
    chmod 755 "$policy"
    trap 'rm -f "$policy"' EXIT
fi

# Refresh the package lists only when apt cannot find a candidate.
if ! apt-get install -s -y --no-install-recommends "${missing[@]}" >/dev/null 2>&1; then
    apt-get update -q
fi
apt-get install -y -q --no-install-recommends "${missing[@]}"
echo "slurm install: installed ${missing[*]}"
