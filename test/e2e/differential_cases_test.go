package e2e

import (
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/kube-storage/csi-provisioner/internal/testutil"
)

// The cases of TestDifferentialCreateVolume.

const selectedNodeAnn = "volume.kubernetes.io/selected-node"

func wffc(sc *storagev1.StorageClass) { waitForFirstConsumer(sc) }

func onNode(node string) func(*testutil.PVCBuilder) {
	return func(b *testutil.PVCBuilder) { b.Annotation(selectedNodeAnn, node) }
}

// allowed restricts a class to zone b or a, or to rack 1 of zone a: two
// terms, several values.
func allowed(sc *storagev1.StorageClass) {
	sc.AllowedTopologies = []corev1.TopologySelectorTerm{
		{MatchLabelExpressions: []corev1.TopologySelectorLabelRequirement{{Key: diffZone, Values: []string{"b", "a"}}}},
		{MatchLabelExpressions: []corev1.TopologySelectorLabelRequirement{
			{Key: diffZone, Values: []string{"a"}}, {Key: diffRack, Values: []string{"1"}},
		}},
	}
}

func params(kv ...string) func(*storagev1.StorageClass) {
	return func(sc *storagev1.StorageClass) {
		if sc.Parameters == nil {
			sc.Parameters = map[string]string{}
		}
		for i := 0; i+1 < len(kv); i += 2 {
			sc.Parameters[kv[i]] = kv[i+1]
		}
	}
}

func both(fs ...func(*storagev1.StorageClass)) func(*storagev1.StorageClass) {
	return func(sc *storagev1.StorageClass) {
		for _, f := range fs {
			f(sc)
		}
	}
}

func modes(m ...corev1.PersistentVolumeAccessMode) func(*testutil.PVCBuilder) {
	return func(b *testutil.PVCBuilder) { b.AccessModes(m...) }
}

// topologyCases are the cases whose request depends on topology, run in
// each topology mode.
func topologyCases() []diffCase {
	return []diffCase{
		{name: "immediate"},
		{name: "immediate-allowed", class: allowed},
		{name: "wffc-n1", class: wffc, claim: onNode("diff-n1")},
		{name: "wffc-n2-allowed", class: both(wffc, allowed), claim: onNode("diff-n2")},
		{name: "immediate-selected", claim: onNode("diff-n2")},
	}
}

func diffGroups() []diffGroup {
	const secretPrefix = "csi.storage.k8s.io/"
	group := "snapshot.storage.k8s.io"
	defaults := append(topologyCases(),
		diffCase{name: "no-binding-mode", class: func(sc *storagev1.StorageClass) { sc.VolumeBindingMode = nil }},
		diffCase{name: "params", class: params("pool", "a", "empty", "")},
		diffCase{name: "fstype", class: params(secretPrefix+"fstype", "xfs")},
		diffCase{name: "secrets", class: params(
			secretPrefix+"provisioner-secret-name", "${pvc.name}-creds",
			secretPrefix+"provisioner-secret-namespace", "${pvc.namespace}",
			secretPrefix+"controller-publish-secret-name", "${pvc.annotations['x']}",
			secretPrefix+"controller-publish-secret-namespace", "${pvc.namespace}",
			secretPrefix+"node-stage-secret-name", "stage-${pvc.name}",
			secretPrefix+"node-stage-secret-namespace", "${pvc.namespace}",
			secretPrefix+"node-publish-secret-name", "${pvc.annotations['x']}",
			secretPrefix+"node-publish-secret-namespace", "${pvc.namespace}",
			secretPrefix+"controller-expand-secret-name", "${pvc.name}",
			secretPrefix+"controller-expand-secret-namespace", "${pvc.namespace}",
			secretPrefix+"node-expand-secret-name", "${pvc.name}",
			secretPrefix+"node-expand-secret-namespace", "${pvc.namespace}",
		), claim: func(b *testutil.PVCBuilder) { b.Annotation("x", "annotated") }},
		diffCase{name: "block", claim: func(b *testutil.PVCBuilder) { b.Block() }},
		diffCase{name: "rwop", claim: modes(corev1.ReadWriteOncePod)},
		diffCase{name: "rwx-rox", claim: modes(corev1.ReadWriteMany, corev1.ReadOnlyMany)},
		diffCase{name: "rox", claim: modes(corev1.ReadOnlyMany)},
		diffCase{name: "limits", claim: func(b *testutil.PVCBuilder) {
			b.Obj().Spec.Resources.Limits = corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("3Gi")}
		}},
		diffCase{name: "small", claim: func(b *testutil.PVCBuilder) { b.Size("1000") }},
		diffCase{name: "odd", claim: func(b *testutil.PVCBuilder) { b.Size("1.5G") }},
		diffCase{name: "mount-options", class: func(sc *storagev1.StorageClass) { sc.MountOptions = []string{"noatime", "nfsvers=4.1"} }},
		diffCase{name: "retain", class: func(sc *storagev1.StorageClass) {
			p := corev1.PersistentVolumeReclaimRetain
			sc.ReclaimPolicy = &p
		}},
		diffCase{name: "clone", claim: func(b *testutil.PVCBuilder) { b.Size("2Gi").DataSource(nil, "PersistentVolumeClaim", "src") }},
		diffCase{name: "restore", claim: func(b *testutil.PVCBuilder) { b.DataSource(&group, "VolumeSnapshot", "snap") }},
		diffCase{name: "vac", vac: true},
		diffCase{name: "wffc-n3-no-keys", fails: true, class: wffc, claim: onNode("diff-n3")},
		diffCase{name: "wffc-n4-no-csinode", fails: true, class: wffc, claim: onNode("diff-n4")},
		diffCase{name: "unknown-param", fails: true, class: params(secretPrefix+"unknown", "x")},
		diffCase{name: "no-secret", fails: true, class: params(
			secretPrefix+"provisioner-secret-name", "missing",
			secretPrefix+"provisioner-secret-namespace", "${pvc.namespace}",
		)},
		diffCase{name: "populator", noCreate: true, claim: func(b *testutil.PVCBuilder) {
			apiGroup := "example.com"
			b.Obj().Spec.DataSourceRef = &corev1.TypedObjectReference{APIGroup: &apiGroup, Kind: "Widget", Name: "w"}
		}},
	)
	return []diffGroup{
		{name: "defaults", cases: defaults},
		{name: "strict-topology", flags: []string{"--strict-topology"}, cases: topologyCases()},
		{name: "immediate-topology-off", flags: []string{"--immediate-topology=false"}, cases: topologyCases()},
		{name: "no-topology", noTopology: true, cases: topologyCases()},
		{
			name: "flags", uuidLength: 10,
			flags: []string{
				"--extra-create-metadata", "--volume-name-prefix=vol", "--volume-name-uuid-length=10",
				"--default-fstype=ext4", "--controller-publish-readonly",
			},
			cases: []diffCase{
				{name: "plain"},
				{name: "fstype", class: params(secretPrefix+"fstype", "xfs")},
				{name: "block", claim: func(b *testutil.PVCBuilder) { b.Block() }},
				{name: "rox", claim: modes(corev1.ReadOnlyMany)},
				{name: "rwx-rox", claim: modes(corev1.ReadWriteMany, corev1.ReadOnlyMany)},
			},
		},
	}
}
