//go:build deps

// Package deps pins the product's direct dependencies in go.mod while the
// packages that use them are being written. It is never built. Remove an
// import here once real code imports the package.
package deps

import (
	_ "github.com/container-storage-interface/spec/lib/go/csi"
	_ "github.com/kubernetes-csi/csi-lib-utils/accessmodes"
	_ "github.com/kubernetes-csi/csi-lib-utils/connection"
	_ "github.com/kubernetes-csi/csi-lib-utils/leaderelection"
	_ "github.com/kubernetes-csi/csi-lib-utils/metrics"
	_ "github.com/kubernetes-csi/csi-lib-utils/protosanitizer"
	_ "github.com/kubernetes-csi/csi-lib-utils/rpc"
	_ "github.com/kubernetes-csi/csi-lib-utils/standardflags"
	_ "github.com/kubernetes-csi/csi-test/v5/driver"
	_ "github.com/kubernetes-csi/csi-test/v5/pkg/sanity"
	_ "github.com/onsi/ginkgo/v2"
	_ "github.com/onsi/gomega"
	_ "go.uber.org/mock/gomock"
	_ "google.golang.org/grpc"
	_ "k8s.io/client-go/informers"
	_ "k8s.io/client-go/kubernetes/fake"
	_ "k8s.io/component-base/featuregate"
	_ "k8s.io/component-base/logs/api/v1"
	_ "k8s.io/component-base/metrics/legacyregistry"
	_ "k8s.io/component-helpers/storage/volume"
	_ "sigs.k8s.io/sig-storage-lib-external-provisioner/v13/controller"
	_ "sigs.k8s.io/yaml"
)
