#!/usr/bin/env bash
# Prepares podman for bench/run: installs podman and runc from Debian when
# missing, and writes a containers.conf for the benchmark (runc, cgroupfs,
# file events, explicit default_ulimits — podman fails on this kind of host
# without them) to the path given. It never touches /etc/containers: the
# benchmark points podman at the file with $CONTAINERS_CONF.
#   usage: podman-setup.sh CONTAINERS_CONF_PATH
set -euo pipefail
conf=${1:?containers.conf path}
if ! command -v podman >/dev/null || ! command -v runc >/dev/null; then
  echo "podman-setup: installing podman and runc from Debian" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends podman runc >/dev/null
fi
runc=$(command -v runc)
# podman sets nproc and nofile limits in the container; on a host without
# CAP_SYS_RESOURCE (sandboxes) runc gets EPERM for its defaults, so ask for
# modest limits below any host's hard limit.
cat >"$conf" <<CONF
[containers]
default_ulimits = ["nproc=4096:4096", "nofile=1024:1024"]
log_driver = "k8s-file"

[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
runtime = "runc"

[engine.runtimes]
runc = ["$runc"]
CONF
echo "podman-setup: $(podman --version), runtime $runc, config $conf" >&2
