package provisioner

import (
	"maps"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/kube-storage/csi-provisioner/internal/testutil"
	"github.com/kube-storage/csi-provisioner/pkg/csiclient"
)

// fuzzParamKeys are the StorageClass parameter keys the fuzz targets pick
// from by index, so that the fuzzer reaches the keys that mean something
// without having to guess them.
var fuzzParamKeys = func() []string {
	keys := []string{prefixedFSTypeKey, "fstype", "FSType", pvcNameKey, "other", reservedPrefix + "unknown"}
	for _, k := range []secretKind{defaultSecret, provisionerSecret, controllerPublishSecret, nodeStageSecret,
		nodePublishSecret, controllerExpandSecret, nodeExpandSecret, controllerModifySecret} {
		keys = append(keys, k.nameKey, k.namespaceKey)
		if k.deprecatedNameKey != "" {
			keys = append(keys, k.deprecatedNameKey, k.deprecatedNamespaceKey)
		}
	}
	return keys
}()

// FuzzClassParameters feeds StorageClass parameters (three picked keys and
// one free key, any values) and a claim of any name, namespace and
// annotation to the parameter parsing of prepare. Invariants: no panic;
// every resolved secret reference has a DNS-1123 label namespace and a
// DNS-1123 subdomain name; a namespace never depends on what the claim's
// user controls (its name and annotations); the parameters sent to
// CreateVolume are exactly the ones GetCapacity gets
// (csiclient.DriverParameters) and hold no reserved key; fsType is the
// value of the one fstype key given, else the default.
func FuzzClassParameters(f *testing.F) {
	f.Add(uint8(2), "${pvc.name}-secret", uint8(3), "${pvc.namespace}", uint8(0), "ext4", "free", "value",
		"claim", "ns", "owner", "alice", "pvc-1")
	f.Add(uint8(8), "${pvc.annotations['owner']}", uint8(9), "${pv.name}", uint8(1), "xfs", "fstype", "ext4",
		"claim-web-0", "ns", "owner", "alice", "pvc-1")
	f.Add(uint8(6), "name", uint8(7), "${pvc.name}", uint8(5), "x", "csi.storage.k8s.io/fstype", "",
		"c", "n", "k", "v", "p")
	f.Add(uint8(10), "$pvc.name", uint8(11), "$$", uint8(4), "", "", "", "c", "n", "k", "v", "p")
	f.Fuzz(func(t *testing.T, k1 uint8, v1 string, k2 uint8, v2 string, k3 uint8, v3, freeKey, freeValue,
		claimName, claimNamespace, annKey, annValue, pvName string) {
		params := map[string]string{}
		for _, kv := range []struct {
			k uint8
			v string
		}{{k1, v1}, {k2, v2}, {k3, v3}} {
			params[fuzzParamKeys[int(kv.k)%len(fuzzParamKeys)]] = kv.v
		}
		params[freeKey] = freeValue
		claim := testutil.NewPVC(claimNamespace, claimName).Annotation(annKey, annValue).Obj()
		logger := logr.Discard()

		refs, err := resolveSecretRefs(logger, params, pvName, claim)
		if err == nil {
			checkRefs(t, refs)
			other := testutil.NewPVC(claimNamespace, claimName+"-other").Obj()
			if refs2, err := resolveSecretRefs(logger, params, pvName, other); err == nil {
				for i, r := range allRefs(refs) {
					if r2 := allRefs(refs2)[i]; (r == nil) != (r2 == nil) || r != nil && r.Namespace != r2.Namespace {
						t.Errorf("secret %d: namespace %v with the claim's name and annotations, %v without", i, r, r2)
					}
				}
			}
		}

		stripped, err := stripReserved(params)
		if err == nil {
			driver := csiclient.DriverParameters(params)
			if !maps.Equal(stripped, driver) && len(stripped)+len(driver) > 0 {
				t.Errorf("CreateVolume parameters %v, GetCapacity parameters %v", stripped, driver)
			}
			for k := range stripped {
				if strings.HasPrefix(k, reservedPrefix) {
					t.Errorf("reserved key %q passed to the driver", k)
				}
			}
		}

		p := &Provisioner{}
		p.cfg.defaultFSType = "default"
		fsType, err := p.fsType(logger, params)
		var given []string
		for k, v := range params {
			if k == prefixedFSTypeKey || strings.EqualFold(k, deprecatedFSTypeKey) {
				given = append(given, v)
			}
		}
		switch {
		case len(given) > 1:
			if err == nil {
				t.Errorf("fstype given %d times: no error", len(given))
			}
		case err != nil:
			t.Errorf("fsType: %v", err)
		case len(given) == 1 && given[0] != "" && fsType != given[0]:
			t.Errorf("fsType = %q, want %q", fsType, given[0])
		case (len(given) == 0 || given[0] == "") && fsType != "default":
			t.Errorf("fsType = %q, want the default", fsType)
		}
	})
}

func allRefs(r secretRefs) []*corev1.SecretReference {
	return []*corev1.SecretReference{r.provisioner, r.controllerPublish, r.nodeStage, r.nodePublish,
		r.controllerExpand, r.nodeExpand, r.controllerModify}
}

func checkRefs(t *testing.T, refs secretRefs) {
	t.Helper()
	for _, r := range allRefs(refs) {
		if r == nil {
			continue
		}
		if errs := validation.IsDNS1123Label(r.Namespace); len(errs) > 0 {
			t.Errorf("secret namespace %q: %v", r.Namespace, errs)
		}
		if errs := validation.IsDNS1123Subdomain(r.Name); len(errs) > 0 {
			t.Errorf("secret name %q: %v", r.Name, errs)
		}
	}
}
