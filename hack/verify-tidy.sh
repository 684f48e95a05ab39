#!/usr/bin/env bash
# Fails if `go mod tidy` would change go.mod or go.sum of the product or of a
# tool module.
set -euo pipefail
cd "$(dirname "$0")/.."
status=0
for dir in . hack/tools/k8s hack/tools/k8s-compat hack/tools/etcd hack/tools/helm hack/tools/kustomize hack/tools/golangci-lint hack/tools/external-provisioner hack/tools/image; do
	( cd "$dir" && cp go.mod go.mod.orig && cp go.sum go.sum.orig &&
	  go mod tidy >/dev/null 2>&1 ;
	  if ! cmp -s go.mod go.mod.orig || ! cmp -s go.sum go.sum.orig; then
		echo "go mod tidy changes $dir/go.mod or go.sum" >&2; diff go.mod.orig go.mod >&2 || true; exit 1
	  fi ) || status=1
	( cd "$dir" && mv go.mod.orig go.mod && mv go.sum.orig go.sum )
done
exit $status
