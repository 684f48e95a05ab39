package provisioner

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	csitrans "k8s.io/csi-translation-lib"
	"k8s.io/klog/v2"
)

// CSI migration. With WithInTreeMigration, the provisioner also serves the
// StorageClasses of the in-tree volume plugin whose volumes its driver took
// over (kubernetes.io/aws-ebs for ebs.csi.aws.com, ...), as upstream: the
// class is translated to the driver's parameters by k8s.io/csi-translation-lib
// before the request is built, the PV is translated back to the in-tree
// volume source (kube-controller-manager and the kubelet translate it again
// where they act on it), and an in-tree PV of the plugin is translated to
// CSI to be deleted. The library knows the plugin's name as an additional
// provisioner name (controller.AdditionalProvisionerNames), so it deletes
// the PVs whose provisioned-by annotation is that name.

// WithInTreeMigration sets the in-tree plugin (for example
// kubernetes.io/aws-ebs) whose classes and volumes this driver serves; ""
// (the default) serves none. cmd sets it when csi-translation-lib says the
// driver is a migration target.
func WithInTreeMigration(inTreePlugin string) Option {
	return func(c *config) { c.inTree = inTreePlugin }
}

// ownsClass reports whether class names this driver, or the migrated in-tree
// plugin, as provisioner.
func (p *Provisioner) ownsClass(class *storagev1.StorageClass) bool {
	return class.Provisioner == p.name || (p.cfg.inTree != "" && class.Provisioner == p.cfg.inTree)
}

// csiClass returns the class the request is built from: class itself, or,
// for a class of the migrated in-tree plugin, its translation to the
// driver's parameters (migrated is then true).
func (p *Provisioner) csiClass(logger klog.Logger, class *storagev1.StorageClass) (csiClass *storagev1.StorageClass, migrated bool, err error) {
	if class == nil || p.cfg.inTree == "" || class.Provisioner != p.cfg.inTree {
		return class, false, nil
	}
	translated, err := csitrans.New().TranslateInTreeStorageClassToCSI(logger, p.cfg.inTree, class)
	if err != nil {
		return nil, true, fmt.Errorf("translate the in-tree storage class %s of %s to CSI: %w", class.Name, p.cfg.inTree, err)
	}
	translated.Provisioner = p.name
	return translated, true, nil
}

// csiVolume returns pv's CSI source: its own, or, for an in-tree volume of
// the migrated plugin, the translated one; nil when pv is neither a CSI
// volume of the driver nor such an in-tree volume.
func (p *Provisioner) csiVolume(logger klog.Logger, pv *corev1.PersistentVolume) (*corev1.CSIPersistentVolumeSource, error) {
	switch {
	case pv == nil:
		return nil, nil
	case pv.Spec.CSI != nil:
		if pv.Spec.CSI.Driver == p.name {
			return pv.Spec.CSI, nil
		}
		return nil, nil
	case p.cfg.inTree == "":
		return nil, nil
	}
	trans := csitrans.New()
	if plugin, err := trans.GetInTreePluginNameFromSpec(pv, nil); err != nil || plugin != p.cfg.inTree {
		return nil, nil
	}
	translated, err := trans.TranslateInTreePVToCSI(logger, pv)
	if err != nil {
		return nil, fmt.Errorf("translate the in-tree volume %s of %s to CSI: %w", pv.Name, p.cfg.inTree, err)
	}
	if translated.Spec.CSI == nil || translated.Spec.CSI.Driver != p.name {
		return nil, fmt.Errorf("the in-tree volume %s of %s translates to no CSI volume of %s", pv.Name, p.cfg.inTree, p.name)
	}
	return translated.Spec.CSI, nil
}

// inTreeVolume translates the PV of a migrated class back to the in-tree
// volume source.
func inTreeVolume(pv *corev1.PersistentVolume) (*corev1.PersistentVolume, error) {
	out, err := csitrans.New().TranslateCSIPVToInTree(pv)
	if err != nil {
		return nil, fmt.Errorf("translate the provisioned volume %s back to its in-tree source: %s", pv.Name, withoutPVDump(err))
	}
	return out, nil
}

// withoutPVDump is err's text without the dump of the whole PV that
// csi-translation-lib puts in some of its errors ("failed to translate
// topology. PV:{...}. Error:<cause>"): it would fill the claim's Warning
// with a page of Go struct syntax.
func withoutPVDump(err error) string {
	msg := err.Error()
	before, rest, found := strings.Cut(msg, ". PV:{")
	if !found {
		return msg
	}
	if i := strings.LastIndex(rest, ". Error:"); i >= 0 {
		return before + ": " + rest[i+len(". Error:"):]
	}
	return before
}
