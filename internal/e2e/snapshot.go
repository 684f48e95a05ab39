package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	snapv1 "github.com/kubernetes-csi/external-snapshotter/client/v8/apis/volumesnapshot/v1"
	snapclient "github.com/kubernetes-csi/external-snapshotter/client/v8/clientset/versioned"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"

	"github.com/kube-storage/csi-provisioner/internal/controlplane"
)

// snapshotterModule is the Go module whose config/crd directory holds the
// snapshot CustomResourceDefinitions; go.mod pins its version.
const snapshotterModule = "github.com/kubernetes-csi/external-snapshotter/client/v8"

// snapshotCRDFiles are the CRDs of snapshot.storage.k8s.io, in the order
// they are created. The group snapshot CRDs of the same directory are left
// out: nothing here uses them.
var snapshotCRDFiles = []string{
	"snapshot.storage.k8s.io_volumesnapshotclasses.yaml",
	"snapshot.storage.k8s.io_volumesnapshotcontents.yaml",
	"snapshot.storage.k8s.io_volumesnapshots.yaml",
}

var crdResource = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// snapshotCRDTimeout bounds how long InstallSnapshotCRDs waits for the API
// server to serve the new resources.
const snapshotCRDTimeout = 2 * time.Minute

// InstallSnapshotCRDs creates the VolumeSnapshot, VolumeSnapshotContent and
// VolumeSnapshotClass CustomResourceDefinitions of the external-snapshotter
// client module pinned in go.mod (read from its config/crd directory in the
// module cache, located with `go list -m` from the repository root, so the
// go tool must be on PATH and the module downloaded) in the cluster of cfg.
// CRDs that already exist are left as they are, so calling it twice is
// fine. It returns once the snapshot clientset can list VolumeSnapshots in
// namespace "default", VolumeSnapshotContents and VolumeSnapshotClasses, or
// with an error after two minutes or when ctx ends.
func InstallSnapshotCRDs(ctx context.Context, cfg *rest.Config) error {
	dir, err := snapshotCRDDir(ctx)
	if err != nil {
		return err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("dynamic client: %w", err)
	}
	for _, f := range snapshotCRDFiles {
		if err := createCRDs(ctx, dyn, filepath.Join(dir, f)); err != nil {
			return err
		}
	}
	snap, err := snapclient.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("snapshot client: %w", err)
	}
	list := metav1.ListOptions{Limit: 1}
	return waitServed(ctx, "snapshot CRDs",
		func(ctx context.Context) error {
			_, err := snap.SnapshotV1().VolumeSnapshots(metav1.NamespaceDefault).List(ctx, list)
			return err
		},
		func(ctx context.Context) error {
			_, err := snap.SnapshotV1().VolumeSnapshotContents().List(ctx, list)
			return err
		},
		func(ctx context.Context) error {
			_, err := snap.SnapshotV1().VolumeSnapshotClasses().List(ctx, list)
			return err
		},
	)
}

// waitServed polls until every list call succeeds (the API server serves
// the resources of a CRD just created), at most snapshotCRDTimeout.
func waitServed(ctx context.Context, what string, lists ...func(context.Context) error) error {
	var lastErr error
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, snapshotCRDTimeout, true, func(ctx context.Context) (bool, error) {
		for _, list := range lists {
			if lastErr = list(ctx); lastErr != nil {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("%s not served: %w", what, errors.Join(err, lastErr))
	}
	return nil
}

// snapshotCRDDir returns the config/crd directory of snapshotterModule in
// the module cache.
func snapshotCRDDir(ctx context.Context) (string, error) {
	root, err := controlplane.RepoRoot()
	if err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Dir}}", snapshotterModule)
	cmd.Dir = root
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go list -m %s: %w\n%s", snapshotterModule, err, stderr.String())
	}
	modDir := strings.TrimSpace(string(out))
	if modDir == "" {
		return "", fmt.Errorf("go list -m %s: module not in the module cache (run `go mod download %s`)", snapshotterModule, snapshotterModule)
	}
	dir := filepath.Join(modDir, "config", "crd")
	if _, err := os.Stat(dir); err != nil {
		return "", fmt.Errorf("snapshot CRD directory: %w", err)
	}
	return dir, nil
}

// createCRDs creates the CustomResourceDefinitions of a YAML file; those
// that exist are left as they are.
func createCRDs(ctx context.Context, dyn dynamic.Interface, path string) error {
	objs, err := decodeYAMLFile(path)
	if err != nil {
		return err
	}
	for _, obj := range objs {
		if obj.GetKind() != "CustomResourceDefinition" {
			return fmt.Errorf("%s: expected a CustomResourceDefinition, found %s %q", path, obj.GetKind(), obj.GetName())
		}
		// The files may carry an empty status block; the server owns it.
		unstructured.RemoveNestedField(obj.Object, "status")
		_, err := dyn.Resource(crdResource).Create(ctx, obj, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create CRD %s from %s: %w", obj.GetName(), path, err)
		}
	}
	return nil
}

// decodeYAMLFile decodes every non-empty document of a YAML (or JSON) file.
func decodeYAMLFile(path string) ([]*unstructured.Unstructured, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	dec := yaml.NewYAMLOrJSONDecoder(f, 4096)
	var objs []*unstructured.Unstructured
	for {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return objs, nil
			}
			return nil, fmt.Errorf("decode %s: %w", path, err)
		}
		if len(m) == 0 {
			continue
		}
		objs = append(objs, &unstructured.Unstructured{Object: m})
	}
}

// CreateSnapshot asks the driver, over the CSI ControllerServer on its
// socket, to snapshot volume sourceVolumeID under the CSI name name, and
// returns the snapshot's ID and size in bytes. The hostpath driver's
// snapshots are ready when the call returns, and asking again with the same
// name and source returns the same snapshot.
func (d *Driver) CreateSnapshot(ctx context.Context, sourceVolumeID, name string) (snapshotID string, sizeBytes int64, err error) {
	conn, err := dial(d.Socket)
	if err != nil {
		return "", 0, fmt.Errorf("dial %s: %w", d.Socket, err)
	}
	defer func() { _ = conn.Close() }()
	resp, err := csi.NewControllerClient(conn).CreateSnapshot(ctx, &csi.CreateSnapshotRequest{
		SourceVolumeId: sourceVolumeID,
		Name:           name,
	})
	if err != nil {
		return "", 0, fmt.Errorf("CreateSnapshot %s of volume %s on %s: %w", name, sourceVolumeID, d.Socket, err)
	}
	s := resp.GetSnapshot()
	return s.GetSnapshotId(), s.GetSizeBytes(), nil
}

// DeleteSnapshot asks the driver, over the CSI ControllerServer on its
// socket, to delete snapshot snapshotID.
func (d *Driver) DeleteSnapshot(ctx context.Context, snapshotID string) error {
	conn, err := dial(d.Socket)
	if err != nil {
		return fmt.Errorf("dial %s: %w", d.Socket, err)
	}
	defer func() { _ = conn.Close() }()
	if _, err := csi.NewControllerClient(conn).DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: snapshotID}); err != nil {
		return fmt.Errorf("DeleteSnapshot %s on %s: %w", snapshotID, d.Socket, err)
	}
	return nil
}

// SnapshotContentName is the name CreateReadySnapshot gives the
// VolumeSnapshotContent of the VolumeSnapshot namespace/name.
func SnapshotContentName(namespace, name string) string {
	return "snapcontent-" + namespace + "-" + name
}

// CreateReadySnapshot plays the snapshot-controller for a pre-provisioned
// snapshot, for clusters that run none: it creates the VolumeSnapshot
// namespace/name bound to a new cluster-scoped VolumeSnapshotContent named
// [SnapshotContentName] (driver, deletion policy Retain, source snapshot
// handle snapshotHandle, source volume mode Filesystem), then marks both
// ready to use with restore size restoreSize bytes through their status
// subresources. The snapshot class is left unset. It returns the
// VolumeSnapshot as stored after its status update. On error, objects
// already created are left behind; [DeleteSnapshot] removes them.
func CreateReadySnapshot(ctx context.Context, c snapclient.Interface, namespace, name, driver, snapshotHandle string, restoreSize int64) (*snapv1.VolumeSnapshot, error) {
	if restoreSize < 0 {
		return nil, fmt.Errorf("snapshot %s/%s: negative restore size %d", namespace, name, restoreSize)
	}
	contentName := SnapshotContentName(namespace, name)
	snap, err := c.SnapshotV1().VolumeSnapshots(namespace).Create(ctx, &snapv1.VolumeSnapshot{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: snapv1.VolumeSnapshotSpec{
			Source: snapv1.VolumeSnapshotSource{VolumeSnapshotContentName: &contentName},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("create VolumeSnapshot %s/%s: %w", namespace, name, err)
	}
	mode := corev1.PersistentVolumeFilesystem
	content, err := c.SnapshotV1().VolumeSnapshotContents().Create(ctx, &snapv1.VolumeSnapshotContent{
		ObjectMeta: metav1.ObjectMeta{Name: contentName},
		Spec: snapv1.VolumeSnapshotContentSpec{
			Driver:         driver,
			DeletionPolicy: snapv1.VolumeSnapshotContentRetain,
			Source:         snapv1.VolumeSnapshotContentSource{SnapshotHandle: &snapshotHandle},
			VolumeSnapshotRef: corev1.ObjectReference{
				APIVersion: snapv1.SchemeGroupVersion.String(),
				Kind:       "VolumeSnapshot",
				Namespace:  namespace,
				Name:       name,
				UID:        snap.UID,
			},
			SourceVolumeMode: &mode,
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("create VolumeSnapshotContent %s: %w", contentName, err)
	}

	ready := true
	created := time.Now()
	createdNanos := created.UnixNano()
	contents := c.SnapshotV1().VolumeSnapshotContents()
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if content == nil {
			var err error
			if content, err = contents.Get(ctx, contentName, metav1.GetOptions{}); err != nil {
				return err
			}
		}
		content.Status = &snapv1.VolumeSnapshotContentStatus{
			SnapshotHandle: &snapshotHandle,
			ReadyToUse:     &ready,
			RestoreSize:    &restoreSize,
			CreationTime:   &createdNanos,
		}
		_, err := contents.UpdateStatus(ctx, content, metav1.UpdateOptions{})
		content = nil // a retry starts from the stored object
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("update status of VolumeSnapshotContent %s: %w", contentName, err)
	}

	snaps := c.SnapshotV1().VolumeSnapshots(namespace)
	var stored *snapv1.VolumeSnapshot
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if snap == nil {
			var err error
			if snap, err = snaps.Get(ctx, name, metav1.GetOptions{}); err != nil {
				return err
			}
		}
		snap.Status = &snapv1.VolumeSnapshotStatus{
			BoundVolumeSnapshotContentName: &contentName,
			ReadyToUse:                     &ready,
			RestoreSize:                    resource.NewQuantity(restoreSize, resource.BinarySI),
			CreationTime:                   &metav1.Time{Time: created},
		}
		var err error
		stored, err = snaps.UpdateStatus(ctx, snap, metav1.UpdateOptions{})
		snap = nil // a retry starts from the stored object
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("update status of VolumeSnapshot %s/%s: %w", namespace, name, err)
	}
	return stored, nil
}

// DeleteSnapshot removes, for test cleanup, the VolumeSnapshot
// namespace/name and its VolumeSnapshotContent (the one its spec or status
// names, else [SnapshotContentName]): it clears the finalizers of both, so
// that no missing snapshot-controller holds them, and deletes them. Objects
// that do not exist are skipped; it does not wait for the deletions to
// finish.
func DeleteSnapshot(ctx context.Context, c snapclient.Interface, namespace, name string) error {
	contentName := SnapshotContentName(namespace, name)
	snaps := c.SnapshotV1().VolumeSnapshots(namespace)
	snap, err := snaps.Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return fmt.Errorf("get VolumeSnapshot %s/%s: %w", namespace, name, err)
	default:
		if n := snap.Spec.Source.VolumeSnapshotContentName; n != nil && *n != "" {
			contentName = *n
		} else if snap.Status != nil && snap.Status.BoundVolumeSnapshotContentName != nil && *snap.Status.BoundVolumeSnapshotContentName != "" {
			contentName = *snap.Status.BoundVolumeSnapshotContentName
		}
		if len(snap.Finalizers) > 0 {
			if _, err := snaps.Patch(ctx, name, types.MergePatchType, clearFinalizers, metav1.PatchOptions{}); err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("clear finalizers of VolumeSnapshot %s/%s: %w", namespace, name, err)
			}
		}
		if err := snaps.Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete VolumeSnapshot %s/%s: %w", namespace, name, err)
		}
	}

	contents := c.SnapshotV1().VolumeSnapshotContents()
	content, err := contents.Get(ctx, contentName, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil
	case err != nil:
		return fmt.Errorf("get VolumeSnapshotContent %s: %w", contentName, err)
	}
	if len(content.Finalizers) > 0 {
		if _, err := contents.Patch(ctx, contentName, types.MergePatchType, clearFinalizers, metav1.PatchOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("clear finalizers of VolumeSnapshotContent %s: %w", contentName, err)
		}
	}
	if err := contents.Delete(ctx, contentName, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete VolumeSnapshotContent %s: %w", contentName, err)
	}
	return nil
}

// clearFinalizers is a merge patch that removes all finalizers.
var clearFinalizers = []byte(`{"metadata":{"finalizers":null}}`)
