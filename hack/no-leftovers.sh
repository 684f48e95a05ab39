#!/usr/bin/env bash
# Fails if a test run left an etcd, kube-apiserver or kube-controller-manager
# of the pinned tool cache running. `snapshot` records the ones running before
# (for example a `make demo KEEP=1` in another terminal); `check` reports only
# new ones, after giving exiting processes a moment.
#   usage: hack/no-leftovers.sh snapshot|check
set -euo pipefail
cache=${XDG_CACHE_HOME:-$HOME/.cache}/csi-provisioner
state=$cache/leftovers.snapshot
mkdir -p "$cache"
running() { pgrep -f "$cache/bin/(kubernetes|etcd)-" || true; }
case ${1:?usage: $0 snapshot|check} in
snapshot) running | sort >"$state" ;;
check)
	for _ in $(seq 1 50); do
		new=$(comm -13 "$state" <(running | sort))
		[ -z "$new" ] && exit 0
		sleep 0.2
	done
	echo "processes left running by the tests:" >&2
	for pid in $new; do ps -o pid=,args= -p "$pid" >&2 || true; done
	exit 1
	;;
esac
