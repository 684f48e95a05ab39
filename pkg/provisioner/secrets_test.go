package provisioner

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"maps"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	"sigs.k8s.io/sig-storage-lib-external-provisioner/v13/controller"

	"github.com/kube-storage/csi-provisioner/internal/testutil"
)

// TestResolveSecretRef covers the secret parameters and templates
// (upstream's TestGetSecretReference cases and more).
func TestResolveSecretRef(t *testing.T) {
	claim := testutil.NewPVC("claimns", "claimname").Annotation("owner", "alice").Annotation("bad", "Not_Valid").Obj()
	ref := func(ns, name string) *corev1.SecretReference {
		return &corev1.SecretReference{Namespace: ns, Name: name}
	}
	tests := []struct {
		name    string
		kind    secretKind
		params  map[string]string
		claim   *corev1.PersistentVolumeClaim
		want    *corev1.SecretReference
		wantErr string
	}{
		{name: "no params", kind: provisionerSecret, params: nil},
		{name: "empty params", kind: provisionerSecret, params: map[string]string{}},
		{
			name: "deprecated keys", kind: provisionerSecret,
			params: map[string]string{"csiProvisionerSecretName": "name", "csiProvisionerSecretNamespace": "ns"}, want: ref("ns", "name"),
		},
		{
			name: "current keys", kind: nodePublishSecret,
			params: map[string]string{nodePublishSecret.nameKey: "name", nodePublishSecret.namespaceKey: "ns"}, want: ref("ns", "name"),
		},
		{
			name: "deprecated name with current namespace", kind: nodeStageSecret,
			params: map[string]string{"csiNodeStageSecretName": "name", nodeStageSecret.namespaceKey: "ns"}, want: ref("ns", "name"),
		},
		{
			name: "default secret", kind: controllerExpandSecret,
			params: map[string]string{defaultSecret.nameKey: "def", defaultSecret.namespaceKey: "defns"}, want: ref("defns", "def"),
		},
		{
			name: "specific secret wins over the default", kind: controllerModifySecret,
			params: map[string]string{
				defaultSecret.nameKey: "def", defaultSecret.namespaceKey: "defns",
				controllerModifySecret.nameKey: "mod", controllerModifySecret.namespaceKey: "modns",
			},
			want: ref("modns", "mod"),
		},
		{
			name: "deprecated and current name", kind: controllerPublishSecret,
			params: map[string]string{
				"csiControllerPublishSecretName": "a", controllerPublishSecret.nameKey: "b", controllerPublishSecret.namespaceKey: "ns",
			},
			wantErr: `failed to get name and namespace template from params: ControllerPublish secrets specified in parameters with both "csi" and "csi.storage.k8s.io/" keys`,
		},
		{
			name: "name without namespace", kind: provisionerSecret, params: map[string]string{provisionerSecret.nameKey: "a"},
			wantErr: "failed to get name and namespace template from params: either name and namespace for Provisioner secrets specified, Both must be specified",
		},
		{
			name: "default namespace without name", kind: provisionerSecret, params: map[string]string{defaultSecret.namespaceKey: "a"},
			wantErr: "failed to get default name and namespace template from params: either name and namespace for Default secrets specified, Both must be specified",
		},
		{
			name: "empty name", kind: provisionerSecret, params: map[string]string{provisionerSecret.nameKey: "", provisionerSecret.namespaceKey: "ns"},
			wantErr: "Provisioner secrets specified in parameters but value of either namespace or name is empty",
		},
		{
			name: "every name token", kind: nodeExpandSecret, claim: claim,
			params: map[string]string{
				nodeExpandSecret.nameKey:      "${pv.name}-${pvc.namespace}-${pvc.name}-${pvc.annotations['owner']}",
				nodeExpandSecret.namespaceKey: "${pvc.namespace}-${pv.name}",
			},
			want: ref("claimns-pvname", "pvname-claimns-claimname-alice"),
		},
		{
			name: "namespace template may not use the claim name", kind: provisionerSecret, claim: claim,
			params:  map[string]string{provisionerSecret.nameKey: "s", provisionerSecret.namespaceKey: "${pvc.name}"},
			wantErr: `error resolving value "${pvc.name}": invalid tokens: ["pvc.name"]`,
		},
		{
			name: "namespace template may not use annotations", kind: provisionerSecret, claim: claim,
			params:  map[string]string{provisionerSecret.nameKey: "s", provisionerSecret.namespaceKey: "${pvc.annotations['owner']}"},
			wantErr: `error resolving value "${pvc.annotations['owner']}": invalid tokens: ["pvc.annotations['owner']"]`,
		},
		{
			name: "unknown tokens are all named", kind: provisionerSecret, claim: claim,
			params:  map[string]string{provisionerSecret.nameKey: "${b}${a}${b}", provisionerSecret.namespaceKey: "ns"},
			wantErr: `error resolving value "${b}${a}${b}": invalid tokens: ["a" "b"]`,
		},
		{
			name: "missing annotation", kind: provisionerSecret, claim: claim,
			params:  map[string]string{provisionerSecret.nameKey: "${pvc.annotations['nope']}", provisionerSecret.namespaceKey: "ns"},
			wantErr: `invalid tokens: ["pvc.annotations['nope']"]`,
		},
		{
			name: "resolved name invalid", kind: provisionerSecret, claim: claim,
			params:  map[string]string{provisionerSecret.nameKey: "${pvc.annotations['bad']}", provisionerSecret.namespaceKey: "ns"},
			wantErr: `"${pvc.annotations['bad']}" resolved to "Not_Valid" which is not a valid secret name`,
		},
		{
			name: "literal name invalid", kind: provisionerSecret,
			params:  map[string]string{provisionerSecret.nameKey: "Bad_Name", provisionerSecret.namespaceKey: "ns"},
			wantErr: `"Bad_Name" is not a valid secret name`,
		},
		{
			name: "literal namespace invalid", kind: provisionerSecret,
			params:  map[string]string{provisionerSecret.nameKey: "s", provisionerSecret.namespaceKey: "a.b"},
			wantErr: `"a.b" is not a valid namespace name`,
		},
		{
			name: "resolved namespace invalid", kind: provisionerSecret, claim: claim,
			params:  map[string]string{provisionerSecret.nameKey: "s", provisionerSecret.namespaceKey: "${pv.name}.x"},
			wantErr: `"${pv.name}.x" resolved to "pvname.x" which is not a valid namespace name`,
		},
		{
			name: "claim tokens without a claim", kind: provisionerSecret,
			params:  map[string]string{provisionerSecret.nameKey: "${pvc.name}", provisionerSecret.namespaceKey: "${pvc.namespace}"},
			wantErr: `invalid tokens: ["pvc.namespace"]`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := resolveSecretRef(ktesting.NewLogger(t, ktesting.NewConfig()), tt.kind, tt.params, "pvname", tt.claim)
			if (tt.wantErr == "") != (err == nil) || !strings.Contains(errString(err), tt.wantErr) {
				t.Fatalf("error = %v, want %q", err, tt.wantErr)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("ref = %+v, want %+v", got, tt.want)
			}
		})
	}
}

// TestSecretsOnPV covers the seven secret kinds end to end: the
// provisioner secret's data in the request, the five references on the PV,
// the deletion-secret annotations (always written) and the
// controller-modify annotations (only when configured).
func TestSecretsOnPV(t *testing.T) {
	all := newClass()
	for _, k := range []secretKind{provisionerSecret, controllerPublishSecret, nodeStageSecret, nodePublishSecret, controllerExpandSecret, nodeExpandSecret, controllerModifySecret} {
		all.Param(k.nameKey, strings.ToLower(k.name)+"-${pvc.name}").Param(k.namespaceKey, "${pvc.namespace}")
	}
	ref := func(name string) *corev1.SecretReference {
		return &corev1.SecretReference{Name: name + "-c", Namespace: testNS}
	}
	tests := []struct {
		name       string
		class      *testutil.SCBuilder
		wantData   map[string]string
		wantAnns   map[string]string
		wantSource corev1.CSIPersistentVolumeSource
	}{
		{
			name: "no secrets", class: newClass(),
			wantAnns: map[string]string{annDeletionSecretName: "", annDeletionSecretNS: ""},
		},
		{
			name: "every kind", class: all,
			wantData: map[string]string{"user": "admin"},
			wantAnns: map[string]string{
				annDeletionSecretName: "provisioner-c", annDeletionSecretNS: testNS,
				annModifySecretName: "controllermodify-c", annModifySecretNS: testNS,
			},
			wantSource: corev1.CSIPersistentVolumeSource{
				ControllerPublishSecretRef: ref("controllerpublish"), NodeStageSecretRef: ref("nodestage"),
				NodePublishSecretRef: ref("nodepublish"), ControllerExpandSecretRef: ref("controllerexpand"),
				NodeExpandSecretRef: ref("nodeexpand"),
			},
		},
		{
			name: "default secret for every kind", class: newClass().Param(defaultSecret.nameKey, "def").Param(defaultSecret.namespaceKey, testNS),
			wantData: map[string]string{"k": "v"},
			wantAnns: map[string]string{
				annDeletionSecretName: "def", annDeletionSecretNS: testNS, annModifySecretName: "def", annModifySecretNS: testNS,
			},
			wantSource: func() corev1.CSIPersistentVolumeSource {
				d := &corev1.SecretReference{Name: "def", Namespace: testNS}
				return corev1.CSIPersistentVolumeSource{
					ControllerPublishSecretRef: d, NodeStageSecretRef: d, NodePublishSecretRef: d, ControllerExpandSecretRef: d, NodeExpandSecretRef: d,
				}
			}(),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			claim, class := newClaim("c").Obj(), tt.class.Obj()
			h := newHarness(t, baseCaps(), objs(claim, class,
				secret(testNS, "provisioner-c", map[string]string{"user": "admin"}),
				secret(testNS, "def", map[string]string{"k": "v"})))
			pv, state, err := h.provision(claim, class)
			if err != nil || state != controller.ProvisioningFinished {
				t.Fatalf("Provision = %v, %v", state, err)
			}
			if got := h.driver.createCalls()[0].GetSecrets(); !maps.Equal(got, tt.wantData) {
				t.Errorf("request secrets = %v, want %v", got, tt.wantData)
			}
			if !maps.Equal(pv.Annotations, tt.wantAnns) {
				t.Errorf("PV annotations = %v, want %v", pv.Annotations, tt.wantAnns)
			}
			src := pv.Spec.CSI
			got := corev1.CSIPersistentVolumeSource{
				ControllerPublishSecretRef: src.ControllerPublishSecretRef, NodeStageSecretRef: src.NodeStageSecretRef,
				NodePublishSecretRef: src.NodePublishSecretRef, ControllerExpandSecretRef: src.ControllerExpandSecretRef,
				NodeExpandSecretRef: src.NodeExpandSecretRef,
			}
			if !reflect.DeepEqual(got, tt.wantSource) {
				t.Errorf("PV secret refs = %+v, want %+v", got, tt.wantSource)
			}
		})
	}
}

func TestExpandTemplate(t *testing.T) {
	got, err := expandTemplate("$pv.name", map[string]string{"pv": "x"})
	if err != nil || got != "x.name" {
		t.Errorf("expandTemplate($pv.name) = %q, %v; os.Expand semantics expected", got, err)
	}
}

// TestSecretDataNotLogged reads a secret through a real REST client whose
// context logger is at -v=10, where client-go logs every response body
// (from -v=8), and requires that the secret's value is not in the log
// while the same GET made directly logs it.
func TestSecretDataNotLogged(t *testing.T) {
	const value = "hunter2-not-in-any-log"
	body, err := json.Marshal(&corev1.Secret{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "s"},
		Data:       map[string][]byte{"token": []byte(value)},
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body)
	}))
	t.Cleanup(srv.Close)
	client, err := kubernetes.NewForConfig(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	ref := &corev1.SecretReference{Namespace: "ns", Name: "s"}
	needles := []string{value, base64.StdEncoding.EncodeToString([]byte(value))}
	logged := func(logger klog.Logger) bool {
		log := logger.GetSink().(ktesting.Underlier).GetBuffer().String()
		return slices.ContainsFunc(needles, func(n string) bool { return strings.Contains(log, n) })
	}
	for _, tc := range []struct {
		name string
		get  func(ctx context.Context) (map[string]string, error)
		want bool
	}{
		{name: "client-go directly (proves the check)", want: true, get: func(ctx context.Context) (map[string]string, error) {
			s, err := client.CoreV1().Secrets("ns").Get(ctx, "s", metav1.GetOptions{})
			return map[string]string{"token": string(s.Data["token"])}, err
		}},
		{name: "secretData", get: func(ctx context.Context) (map[string]string, error) {
			return secretData(ctx, client, ref)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.Verbosity(10), ktesting.BufferLogs(true)))
			data, err := tc.get(klog.NewContext(t.Context(), logger))
			if err != nil {
				t.Fatal(err)
			}
			if data["token"] != value {
				t.Fatalf("data = %q, want the secret's value", data)
			}
			if got := logged(logger); got != tc.want {
				t.Errorf("secret value logged = %v, want %v; log:\n%s", got, tc.want, logger.GetSink().(ktesting.Underlier).GetBuffer().String())
			}
		})
	}
}
