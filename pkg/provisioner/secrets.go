package provisioner

import (
	"context"
	"fmt"
	"os"
	"slices"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/kube-storage/csi-provisioner/pkg/csiclient"
)

// reservedPrefix starts the StorageClass parameters meant for the
// provisioner, never passed to the driver.
const reservedPrefix = csiclient.ReservedParameterPrefix

// Template tokens.
const (
	tokenPVName       = "pv.name"
	tokenPVCName      = "pvc.name"
	tokenPVCNamespace = "pvc.namespace"
)

// secretKind is one of the secrets a class can name: the keys of its name
// and namespace templates, current and deprecated, and the name used in
// error messages (upstream's).
type secretKind struct {
	name                   string
	nameKey, namespaceKey  string
	deprecatedNameKey      string // "" when the kind has no deprecated keys
	deprecatedNamespaceKey string
}

var (
	defaultSecret = secretKind{
		name: "Default", nameKey: reservedPrefix + "secret-name", namespaceKey: reservedPrefix + "secret-namespace",
	}
	provisionerSecret = secretKind{
		name: "Provisioner", nameKey: reservedPrefix + "provisioner-secret-name", namespaceKey: reservedPrefix + "provisioner-secret-namespace",
		deprecatedNameKey: "csiProvisionerSecretName", deprecatedNamespaceKey: "csiProvisionerSecretNamespace",
	}
	controllerPublishSecret = secretKind{
		name: "ControllerPublish", nameKey: reservedPrefix + "controller-publish-secret-name", namespaceKey: reservedPrefix + "controller-publish-secret-namespace",
		deprecatedNameKey: "csiControllerPublishSecretName", deprecatedNamespaceKey: "csiControllerPublishSecretNamespace",
	}
	nodeStageSecret = secretKind{
		name: "NodeStage", nameKey: reservedPrefix + "node-stage-secret-name", namespaceKey: reservedPrefix + "node-stage-secret-namespace",
		deprecatedNameKey: "csiNodeStageSecretName", deprecatedNamespaceKey: "csiNodeStageSecretNamespace",
	}
	nodePublishSecret = secretKind{
		name: "NodePublish", nameKey: reservedPrefix + "node-publish-secret-name", namespaceKey: reservedPrefix + "node-publish-secret-namespace",
		deprecatedNameKey: "csiNodePublishSecretName", deprecatedNamespaceKey: "csiNodePublishSecretNamespace",
	}
	controllerExpandSecret = secretKind{
		name: "ControllerExpand", nameKey: reservedPrefix + "controller-expand-secret-name", namespaceKey: reservedPrefix + "controller-expand-secret-namespace",
	}
	nodeExpandSecret = secretKind{
		name: "NodeExpand", nameKey: reservedPrefix + "node-expand-secret-name", namespaceKey: reservedPrefix + "node-expand-secret-namespace",
	}
	controllerModifySecret = secretKind{
		name: "ControllerModify", nameKey: reservedPrefix + "controller-modify-secret-name", namespaceKey: reservedPrefix + "controller-modify-secret-namespace",
	}
)

// knownReservedKeys are the reserved-prefix parameters the provisioner
// understands; any other key with the prefix is an error.
var knownReservedKeys = func() map[string]bool {
	keys := map[string]bool{prefixedFSTypeKey: true}
	for _, k := range []secretKind{defaultSecret, provisionerSecret, controllerPublishSecret, nodeStageSecret,
		nodePublishSecret, controllerExpandSecret, nodeExpandSecret, controllerModifySecret} {
		keys[k.nameKey], keys[k.namespaceKey] = true, true
	}
	return keys
}()

// secretRefs are the resolved secrets of one volume; nil means none.
type secretRefs struct {
	provisioner, controllerPublish, nodeStage, nodePublish *corev1.SecretReference
	controllerExpand, nodeExpand, controllerModify         *corev1.SecretReference
}

// resolveSecretRefs resolves the seven secret references of a volume named
// pvName for claim from the class parameters.
func resolveSecretRefs(logger klog.Logger, params map[string]string, pvName string, claim *corev1.PersistentVolumeClaim) (secretRefs, error) {
	var refs secretRefs
	for _, s := range []struct {
		kind secretKind
		ref  **corev1.SecretReference
	}{
		{provisionerSecret, &refs.provisioner},
		{controllerPublishSecret, &refs.controllerPublish},
		{nodeStageSecret, &refs.nodeStage},
		{nodePublishSecret, &refs.nodePublish},
		{controllerExpandSecret, &refs.controllerExpand},
		{nodeExpandSecret, &refs.nodeExpand},
		{controllerModifySecret, &refs.controllerModify},
	} {
		ref, err := resolveSecretRef(logger, s.kind, params, pvName, claim)
		if err != nil {
			return secretRefs{}, err
		}
		*s.ref = ref
	}
	return refs, nil
}

// secretTemplates returns the name and namespace templates of kind in
// params, both "" when the class names no such secret. Deprecated keys are
// accepted with a logged warning; a template given by both a deprecated and
// a current key, a name without a namespace (or the reverse) and an empty
// template are errors.
func secretTemplates(logger klog.Logger, kind secretKind, params map[string]string) (nameTmpl, nsTmpl string, err error) {
	var names, namespaces int
	if kind.deprecatedNameKey != "" {
		if v, ok := params[kind.deprecatedNameKey]; ok {
			nameTmpl, names = v, names+1
			logger.Info("Deprecated StorageClass parameter, use its replacement", "parameter", kind.deprecatedNameKey, "replacement", kind.nameKey)
		}
		if v, ok := params[kind.deprecatedNamespaceKey]; ok {
			nsTmpl, namespaces = v, namespaces+1
			logger.Info("Deprecated StorageClass parameter, use its replacement", "parameter", kind.deprecatedNamespaceKey, "replacement", kind.namespaceKey)
		}
	}
	if v, ok := params[kind.nameKey]; ok {
		nameTmpl, names = v, names+1
	}
	if v, ok := params[kind.namespaceKey]; ok {
		nsTmpl, namespaces = v, namespaces+1
	}
	switch {
	case names > 1 || namespaces > 1:
		return "", "", fmt.Errorf("%s secrets specified in parameters with both \"csi\" and %q keys", kind.name, reservedPrefix)
	case names != namespaces:
		return "", "", fmt.Errorf("either name and namespace for %s secrets specified, Both must be specified", kind.name)
	case names == 1 && (nameTmpl == "" || nsTmpl == ""):
		return "", "", fmt.Errorf("%s secrets specified in parameters but value of either namespace or name is empty", kind.name)
	}
	return nameTmpl, nsTmpl, nil
}

// resolveSecretRef resolves the secret of kind, falling back to the default
// secret keys, for a volume named pvName of claim. It only resolves the
// templates; whether the secret exists is not checked.
//
// Namespace templates may use ${pv.name} and ${pvc.namespace}, which the
// claim's user does not control. Name templates may also use ${pvc.name}
// and ${pvc.annotations['<key>']}. The results must be a DNS-1123 label
// (namespace) and subdomain (name).
func resolveSecretRef(logger klog.Logger, kind secretKind, params map[string]string, pvName string, claim *corev1.PersistentVolumeClaim) (*corev1.SecretReference, error) {
	nameTmpl, nsTmpl, err := secretTemplates(logger, kind, params)
	if err != nil {
		return nil, fmt.Errorf("failed to get name and namespace template from params: %w", err)
	}
	if nameTmpl == "" && nsTmpl == "" {
		if nameTmpl, nsTmpl, err = secretTemplates(logger, defaultSecret, params); err != nil {
			return nil, fmt.Errorf("failed to get default name and namespace template from params: %w", err)
		}
	}
	if nameTmpl == "" && nsTmpl == "" {
		return nil, nil
	}

	nsValues := map[string]string{tokenPVName: pvName}
	nameValues := map[string]string{tokenPVName: pvName}
	if claim != nil {
		nsValues[tokenPVCNamespace] = claim.Namespace
		nameValues[tokenPVCNamespace] = claim.Namespace
		nameValues[tokenPVCName] = claim.Name
		for k, v := range claim.Annotations {
			nameValues["pvc.annotations['"+k+"']"] = v
		}
	}

	namespace, err := expandTemplate(nsTmpl, nsValues)
	if err != nil {
		return nil, fmt.Errorf("error resolving value %q: %w", nsTmpl, err)
	}
	if len(validation.IsDNS1123Label(namespace)) > 0 {
		if namespace != nsTmpl {
			return nil, fmt.Errorf("%q resolved to %q which is not a valid namespace name", nsTmpl, namespace)
		}
		return nil, fmt.Errorf("%q is not a valid namespace name", nsTmpl)
	}
	name, err := expandTemplate(nameTmpl, nameValues)
	if err != nil {
		return nil, fmt.Errorf("error resolving value %q: %w", nameTmpl, err)
	}
	if len(validation.IsDNS1123Subdomain(name)) > 0 {
		if name != nameTmpl {
			return nil, fmt.Errorf("%q resolved to %q which is not a valid secret name", nameTmpl, name)
		}
		return nil, fmt.Errorf("%q is not a valid secret name", nameTmpl)
	}
	return &corev1.SecretReference{Name: name, Namespace: namespace}, nil
}

// expandTemplate replaces ${token} (and $token) with values; any token
// without a value is an error naming every such token.
func expandTemplate(tmpl string, values map[string]string) (string, error) {
	var missing []string
	out := os.Expand(tmpl, func(token string) string {
		v, ok := values[token]
		if !ok && !slices.Contains(missing, token) {
			missing = append(missing, token)
		}
		return v
	})
	if len(missing) > 0 {
		slices.Sort(missing)
		return "", fmt.Errorf("invalid tokens: %q", missing)
	}
	return out, nil
}

// secretData reads the secret ref points to with a live GET (secrets are
// not cached by the provisioner) and returns its data as strings; nil for a
// nil ref. The values are never logged: client-go logs the body of every
// response through the context's logger from -v=8 (a hex dump of the
// protobuf Secret, its values in clear), so the GET runs with a logger that
// has those levels off; the request's URL and status (-v=6) still show.
func secretData(ctx context.Context, client kubernetes.Interface, ref *corev1.SecretReference) (map[string]string, error) {
	if ref == nil {
		return nil, nil
	}
	if logger := klog.FromContext(ctx); logger.GetSink() != nil {
		ctx = klog.NewContext(ctx, logger.WithSink(newBodylessSink(logger.GetSink())))
	}
	secret, err := client.CoreV1().Secrets(ref.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("error getting secret %s in namespace %s: %w", ref.Name, ref.Namespace, err)
	}
	data := make(map[string]string, len(secret.Data))
	for k, v := range secret.Data {
		data[k] = string(v)
	}
	return data, nil
}

// bodyLevel is the verbosity from which client-go logs request and
// response bodies.
const bodyLevel = 8

// bodylessSink passes everything to its sink but the levels from
// bodyLevel up, which it reports as disabled whatever -v says.
type bodylessSink struct{ logr.LogSink }

// newBodylessSink wraps sink, one call deeper: its Info is called from
// bodylessSink's, so the file:line it reports stays the caller's.
func newBodylessSink(sink logr.LogSink) bodylessSink {
	if d, ok := sink.(logr.CallDepthLogSink); ok {
		sink = d.WithCallDepth(1)
	}
	return bodylessSink{sink}
}

var (
	_ logr.CallDepthLogSink       = bodylessSink{}
	_ logr.CallStackHelperLogSink = bodylessSink{}
)

func (s bodylessSink) Enabled(level int) bool {
	return level < bodyLevel && s.LogSink.Enabled(level)
}

func (s bodylessSink) Info(level int, msg string, keysAndValues ...any) {
	if level < bodyLevel {
		s.LogSink.Info(level, msg, keysAndValues...)
	}
}

func (s bodylessSink) WithValues(keysAndValues ...any) logr.LogSink {
	return bodylessSink{s.LogSink.WithValues(keysAndValues...)}
}

func (s bodylessSink) WithName(name string) logr.LogSink {
	return bodylessSink{s.LogSink.WithName(name)}
}

// WithCallDepth keeps the call sites client-go reports (file:line).
func (s bodylessSink) WithCallDepth(depth int) logr.LogSink {
	if d, ok := s.LogSink.(logr.CallDepthLogSink); ok {
		return bodylessSink{d.WithCallDepth(depth)}
	}
	return s
}

func (s bodylessSink) GetCallStackHelper() func() {
	if h, ok := s.LogSink.(logr.CallStackHelperLogSink); ok {
		return h.GetCallStackHelper()
	}
	return func() {}
}
