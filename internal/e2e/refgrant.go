package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/kube-storage/csi-provisioner/pkg/refgrant"
)

// gatewayAPIModule is the Gateway API release whose ReferenceGrant CRD the
// tests install. It is not a dependency of the product: the go tool fetches
// it from the module proxy into the module cache, once.
const gatewayAPIModule = "sigs.k8s.io/gateway-api@v1.6.3"

// referenceGrantCRD is the CRD's file in that module.
const referenceGrantCRD = "config/crd/standard/gateway.networking.k8s.io_referencegrants.yaml"

// InstallReferenceGrantCRD creates the Gateway API's ReferenceGrant
// CustomResourceDefinition (of gatewayAPIModule; `go mod download` fetches
// it, so the go tool must be on PATH) in the cluster of cfg, and returns
// once ReferenceGrants can be listed, or with an error after two minutes
// or when ctx ends. Calling it twice is fine.
func InstallReferenceGrantCRD(ctx context.Context, cfg *rest.Config) error {
	cmd := exec.CommandContext(ctx, "go", "mod", "download", "-json", gatewayAPIModule)
	cmd.Dir = os.TempDir() // outside any module: nothing's go.mod changes
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var mod struct{ Dir, Error string }
	_ = json.Unmarshal(out, &mod) // a failed download says why in Error
	switch {
	case mod.Error != "":
		return fmt.Errorf("go mod download %s: %s", gatewayAPIModule, mod.Error)
	case err != nil:
		return fmt.Errorf("go mod download %s: %w\n%s", gatewayAPIModule, err, stderr.String())
	case mod.Dir == "":
		return fmt.Errorf("go mod download %s: no directory in its answer %q", gatewayAPIModule, out)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("dynamic client: %w", err)
	}
	if err := createCRDs(ctx, dyn, filepath.Join(mod.Dir, referenceGrantCRD)); err != nil {
		return err
	}
	return waitServed(ctx, "ReferenceGrants", func(ctx context.Context) error {
		_, err := dyn.Resource(refgrantGVR("v1beta1")).Namespace(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{Limit: 1})
		return err
	})
}

// ReferenceGrant is a grant in Namespace that lets the
// PersistentVolumeClaims of FromNamespace refer to the objects of Group and
// Kind there: the one named ToName, or all of them when ToName is "".
type ReferenceGrant struct {
	Namespace, Name, FromNamespace string
	Group, Kind, ToName            string
}

// CreateReferenceGrant creates g (v1beta1, the version upstream reads).
func CreateReferenceGrant(ctx context.Context, cfg *rest.Config, g ReferenceGrant) error {
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("dynamic client: %w", err)
	}
	to := map[string]any{"group": g.Group, "kind": g.Kind}
	if g.ToName != "" {
		to["name"] = g.ToName
	}
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": refgrant.Group + "/v1beta1",
		"kind":       "ReferenceGrant",
		"metadata":   map[string]any{"namespace": g.Namespace, "name": g.Name},
		"spec": map[string]any{
			"from": []any{map[string]any{"group": "", "kind": "PersistentVolumeClaim", "namespace": g.FromNamespace}},
			"to":   []any{to},
		},
	}}
	if _, err := dyn.Resource(refgrantGVR("v1beta1")).Namespace(g.Namespace).Create(ctx, obj, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create ReferenceGrant %s/%s: %w", g.Namespace, g.Name, err)
	}
	return nil
}

// DeleteReferenceGrant deletes the grant namespace/name.
func DeleteReferenceGrant(ctx context.Context, cfg *rest.Config, namespace, name string) error {
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("dynamic client: %w", err)
	}
	if err := dyn.Resource(refgrantGVR("v1beta1")).Namespace(namespace).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		return fmt.Errorf("delete ReferenceGrant %s/%s: %w", namespace, name, err)
	}
	return nil
}

func refgrantGVR(version string) schema.GroupVersionResource {
	return schema.GroupVersionResource{Group: refgrant.Group, Version: version, Resource: refgrant.Resource}
}
