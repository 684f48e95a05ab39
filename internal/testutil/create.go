package testutil

import (
	"context"
	"fmt"
	"testing"

	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// DefaultClassAnnotation marks the default StorageClass.
const DefaultClassAnnotation = "storageclass.kubernetes.io/is-default-class"

// CreateClass creates sc (a builder's object: its resourceVersion and UID
// are cleared) through c and deletes it when t ends.
func CreateClass(t testing.TB, c kubernetes.Interface, sc *storagev1.StorageClass) *storagev1.StorageClass {
	t.Helper()
	sc.ResourceVersion, sc.UID = "", ""
	created, err := c.StorageV1().StorageClasses().Create(t.Context(), sc, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.StorageV1().StorageClasses().Delete(context.Background(), created.Name, metav1.DeleteOptions{})
	})
	return created
}

// SetDefaultClass sets (isDefault) or clears the annotation
// storageclass.kubernetes.io/is-default-class of the class name through c.
func SetDefaultClass(t testing.TB, c kubernetes.Interface, name string, isDefault bool) {
	t.Helper()
	patch := fmt.Appendf(nil, `{"metadata":{"annotations":{%q:"%t"}}}`, DefaultClassAnnotation, isDefault)
	if _, err := c.StorageV1().StorageClasses().Patch(t.Context(), name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}
