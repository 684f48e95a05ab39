#!/usr/bin/env bash
# Builds the pinned tools the tests, the demo and the linters run, from the Go
# module proxy, into a cache outside the checkout:
#
#   ${XDG_CACHE_HOME:-$HOME/.cache}/csi-provisioner/bin/<tool>-<version>/
#
# A binary is used only if it reports the pinned version; a missing or
# wrong-version binary is rebuilt. Builds go to a temporary directory and are
# renamed into place, so an interrupted build never leaves a broken binary.
#
#   usage: hack/tools/build.sh [kubernetes|kubernetes-compat|etcd|helm|kustomize|golangci-lint|external-provisioner|all|path TOOL]
#   kubernetes-compat is the older Kubernetes `make test-compat` runs against
#   (KUBERNETES_COMPAT_VERSION); `all` leaves it out.
#   `path TOOL` prints the directory holding TOOL's binaries and builds nothing.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
. "$here/versions.env"
cache=${XDG_CACHE_HOME:-$HOME/.cache}/csi-provisioner/bin

log() { printf 'tools: %s\n' "$*" >&2; }

dir_of() {
	case $1 in
	kubernetes) echo "$cache/kubernetes-$KUBERNETES_VERSION" ;;
	kubernetes-compat) echo "$cache/kubernetes-$KUBERNETES_COMPAT_VERSION" ;;
	etcd) echo "$cache/etcd-$ETCD_VERSION" ;;
	helm) echo "$cache/helm-$HELM_VERSION" ;;
	kustomize) echo "$cache/kustomize-$KUSTOMIZE_VERSION" ;;
	golangci-lint) echo "$cache/golangci-lint-$GOLANGCI_LINT_VERSION" ;;
	external-provisioner) echo "$cache/external-provisioner-$EXTERNAL_PROVISIONER_VERSION" ;;
	*) echo "unknown tool $1" >&2; exit 2 ;;
	esac
}

# has_version BINARY WANT ARGS...: true if "BINARY ARGS..." prints WANT.
has_version() {
	local bin=$1 want=$2
	shift 2
	[ -x "$bin" ] || return 1
	local got
	got=$("$bin" "$@" 2>&1 | head -3) || return 1
	case $got in *"$want"*) return 0 ;; esac
	log "$bin reports '$got', want $want: rebuilding"
	return 1
}

# install_into DIR BUILD_FUNC: runs BUILD_FUNC TMPDIR, then moves every file
# from TMPDIR into DIR.
install_into() {
	local dir=$1 fn=$2 tmp
	mkdir -p "$dir"
	tmp=$(mktemp -d "$dir/.build.XXXXXX")
	if ! "$fn" "$tmp"; then
		rm -rf "$tmp"
		return 1
	fi
	local f
	for f in "$tmp"/*; do mv -f "$f" "$dir/"; done
	rm -rf "$tmp"
}

# build_k8s_into OUT MODULE_DIR VERSION: builds the wrapper module in
# hack/tools/MODULE_DIR, whose go.mod pins VERSION (hack/tools/k8s/update.sh).
build_k8s_into() {
	local out=$1 mod=$2 version=$3 minor
	minor=${version#v1.}
	minor=${minor%%.*}
	log "building kube-apiserver and kube-controller-manager $version (about 13 minutes on 2 cores when nothing is cached)"
	(cd "$here/$mod" && CGO_ENABLED=0 go build -trimpath -o "$out/" \
		-ldflags "-s -w \
			-X k8s.io/component-base/version.gitVersion=$version \
			-X k8s.io/component-base/version.gitMajor=1 \
			-X k8s.io/component-base/version.gitMinor=$minor \
			-X k8s.io/component-base/version.gitTreeState=clean" \
		./kube-apiserver ./kube-controller-manager)
}

build_kubernetes_into() { build_k8s_into "$1" k8s "$KUBERNETES_VERSION"; }
build_kubernetes_compat_into() { build_k8s_into "$1" k8s-compat "$KUBERNETES_COMPAT_VERSION"; }

build_etcd_into() {
	log "building etcd $ETCD_VERSION (about 2 minutes)"
	(cd "$here/etcd" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$1/etcd" .)
}

build_helm_into() {
	log "building helm $HELM_VERSION (about 3 minutes)"
	(cd "$here/helm" && CGO_ENABLED=0 go build -trimpath -o "$1/helm" \
		-ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" \
		helm.sh/helm/v3/cmd/helm)
}

# kustomize reports the version of its module from the build info, so no
# -ldflags are needed for `kustomize version` to print $KUSTOMIZE_VERSION.
build_kustomize_into() {
	log "building kustomize $KUSTOMIZE_VERSION (about 1 minute)"
	(cd "$here/kustomize" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$1/kustomize" \
		sigs.k8s.io/kustomize/kustomize/v5)
}

build_golangci_lint_into() {
	log "building golangci-lint $GOLANGCI_LINT_VERSION (about 3 minutes)"
	(cd "$here/golangci-lint" && CGO_ENABLED=0 go build -trimpath -o "$1/golangci-lint" \
		-ldflags "-s -w -X main.version=${GOLANGCI_LINT_VERSION#v}" \
		github.com/golangci/golangci-lint/v2/cmd/golangci-lint)
}

# Upstream kubernetes-csi/external-provisioner, for the switchover tests
# (test/integration/switchover_test.go) and make bench-upstream.
build_external_provisioner_into() {
	log "building upstream external-provisioner $EXTERNAL_PROVISIONER_VERSION (about 3 minutes)"
	(cd "$here/external-provisioner" && CGO_ENABLED=0 go build -trimpath -o "$1/csi-provisioner" \
		-ldflags "-s -w -X main.version=$EXTERNAL_PROVISIONER_VERSION" \
		github.com/kubernetes-csi/external-provisioner/v6/cmd/csi-provisioner)
}

ensure() {
	local tool=$1 dir
	dir=$(dir_of "$tool")
	case $tool in
	kubernetes)
		if has_version "$dir/kube-apiserver" "Kubernetes $KUBERNETES_VERSION" --version &&
			has_version "$dir/kube-controller-manager" "Kubernetes $KUBERNETES_VERSION" --version; then return; fi
		install_into "$dir" build_kubernetes_into
		has_version "$dir/kube-apiserver" "Kubernetes $KUBERNETES_VERSION" --version
		;;
	kubernetes-compat)
		if has_version "$dir/kube-apiserver" "Kubernetes $KUBERNETES_COMPAT_VERSION" --version &&
			has_version "$dir/kube-controller-manager" "Kubernetes $KUBERNETES_COMPAT_VERSION" --version; then return; fi
		install_into "$dir" build_kubernetes_compat_into
		has_version "$dir/kube-apiserver" "Kubernetes $KUBERNETES_COMPAT_VERSION" --version
		;;
	etcd)
		has_version "$dir/etcd" "etcd Version: ${ETCD_VERSION#v}" --version && return
		install_into "$dir" build_etcd_into
		has_version "$dir/etcd" "etcd Version: ${ETCD_VERSION#v}" --version
		;;
	helm)
		has_version "$dir/helm" "$HELM_VERSION" version --template '{{.Version}}' && return
		install_into "$dir" build_helm_into
		has_version "$dir/helm" "$HELM_VERSION" version --template '{{.Version}}'
		;;
	kustomize)
		has_version "$dir/kustomize" "$KUSTOMIZE_VERSION" version && return
		install_into "$dir" build_kustomize_into
		has_version "$dir/kustomize" "$KUSTOMIZE_VERSION" version
		;;
	external-provisioner)
		has_version "$dir/csi-provisioner" "$EXTERNAL_PROVISIONER_VERSION" --version && return
		install_into "$dir" build_external_provisioner_into
		has_version "$dir/csi-provisioner" "$EXTERNAL_PROVISIONER_VERSION" --version
		;;
	golangci-lint)
		has_version "$dir/golangci-lint" "${GOLANGCI_LINT_VERSION#v}" --version && return
		install_into "$dir" build_golangci_lint_into
		has_version "$dir/golangci-lint" "${GOLANGCI_LINT_VERSION#v}" --version
		;;
	esac
	log "$tool ready in $dir"
}

case ${1:-all} in
path) dir_of "${2:?usage: $0 path TOOL}" ;;
all) for t in etcd kubernetes helm kustomize golangci-lint; do ensure "$t"; done ;;
*) for t in "$@"; do ensure "$t"; done ;;
esac
