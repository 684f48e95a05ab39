package csiclient_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"go.uber.org/mock/gomock"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kube-storage/csi-provisioner/pkg/csiclient"
)

// TestDriverErrorEchoingSecrets has the driver fail with a message that
// echoes the whole request, secrets included (as a driver formatting the
// request with %v does). The error the sidecar turns into events and logs,
// and the client's own logs at V(5), must not carry the secret values,
// while the call's gRPC code, and so its class, stays the driver's.
func TestDriverErrorEchoingSecrets(t *testing.T) {
	// The third value has characters that the request's text format
	// escapes: %v of the request shows `p\"w\\d\n1`, not the value. The
	// fourth one also has a character that the text format writes as it
	// is but Go's quoting escapes (a no-break space): %v shows
	// `q\"r` + "\u00a0" + `s`, which neither the value nor its Go quoting
	// finds.
	const secret, other, escaped, mixed = "s3cr3t-value", "0th3r-s3cr3t", "p\"w\\d\n1", "q\"r\u00a0s"
	secrets := map[string]string{"password": secret, "token": other, "key": escaped, "cert": mixed}
	echo := func(req fmt.Stringer) error {
		return status.Errorf(codes.Internal, "cannot handle request %v", req)
	}
	tests := []struct {
		name   string
		expect func(d *testDriver)
		call   func(ctx context.Context, c *csiclient.Client) error
	}{
		{
			name: "CreateVolume",
			expect: func(d *testDriver) {
				d.controller.EXPECT().CreateVolume(gomock.Any(), gomock.Any()).
					DoAndReturn(func(_ context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
						return nil, echo(req)
					}).Times(1)
			},
			call: func(ctx context.Context, c *csiclient.Client) error {
				_, err := c.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "pvc-1", Secrets: secrets})
				return err
			},
		},
		{
			name: "DeleteVolume",
			expect: func(d *testDriver) {
				d.controller.EXPECT().DeleteVolume(gomock.Any(), gomock.Any()).
					DoAndReturn(func(_ context.Context, req *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
						return nil, echo(req)
					}).Times(1)
			},
			call: func(ctx context.Context, c *csiclient.Client) error {
				return c.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: "vol-1", Secrets: secrets})
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx, c, logs := connectLogged(t, tc.expect)

			err := tc.call(ctx, c)
			if err == nil {
				t.Fatal("the call succeeded; want the driver's error")
			}
			msg := err.Error()
			if !strings.Contains(msg, "cannot handle request") || !strings.Contains(msg, "***stripped***") {
				t.Errorf("error %q: want the driver's message with the secrets stripped", msg)
			}
			if got := status.Code(err); got != codes.Internal {
				t.Errorf("code = %s, want the driver's Internal", got)
			}
			if got := csiclient.Classify(err, false); got != csiclient.Final {
				t.Errorf("class = %s, want final", got)
			}
			out := logs.String()
			if !strings.Contains(out, "cannot handle request") {
				t.Errorf("the logs do not show the driver's error: the check below proves nothing\n%s", out)
			}
			for _, v := range []string{secret, other, escaped, `p\"w\\d\n1`, mixed, `q\"r` + "\u00a0" + `s`} {
				if strings.Contains(msg, v) {
					t.Errorf("the error carries the secret %q: %s", v, msg)
				}
				if strings.Contains(out, v) {
					t.Errorf("the logs carry the secret %q:\n%s", v, out)
				}
			}
		})
	}
}
