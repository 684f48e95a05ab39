package driver

import (
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
)

func TestSnapshots(t *testing.T) {
	d := newTestDriver(t, nil)
	v1 := mustCreate(t, d, createReq("v1", gi)).GetVolumeId()
	v2 := mustCreate(t, d, createReq("v2", 2*gi)).GetVolumeId()
	create := func(name, source string) (*csi.Snapshot, error) {
		resp, err := d.CreateSnapshot(t.Context(), &csi.CreateSnapshotRequest{Name: name, SourceVolumeId: source})
		return resp.GetSnapshot(), err
	}

	s1, err := create("s1", v1)
	if err != nil {
		t.Fatal(err)
	}
	if !s1.GetReadyToUse() || s1.GetSizeBytes() != gi || s1.GetSourceVolumeId() != v1 || s1.GetCreationTime() == nil {
		t.Errorf("snapshot %v: want ready, 1Gi, source %s, a creation time", s1, v1)
	}
	again, err := create("s1", v1)
	if err != nil || again.GetSnapshotId() != s1.GetSnapshotId() {
		t.Errorf("CreateSnapshot again: %v, %v; want %s", again, err, s1.GetSnapshotId())
	}
	s2, err := create("s2", v2)
	if err != nil {
		t.Fatal(err)
	}

	errTests := []struct {
		name, snap, source string
		want               codes.Code
	}{
		{"same name, other source", "s1", v2, codes.AlreadyExists},
		{"no name", "", v1, codes.InvalidArgument},
		{"no source", "s3", "", codes.InvalidArgument},
		{"unknown source", "s3", "vol-ffffffffffffffff", codes.NotFound},
	}
	for _, tt := range errTests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := create(tt.snap, tt.source)
			wantCode(t, err, tt.want)
		})
	}

	listTests := []struct {
		name string
		req  *csi.ListSnapshotsRequest
		want []string
	}{
		{"all", &csi.ListSnapshotsRequest{}, []string{s1.GetSnapshotId(), s2.GetSnapshotId()}},
		{"by id", &csi.ListSnapshotsRequest{SnapshotId: s2.GetSnapshotId()}, []string{s2.GetSnapshotId()}},
		{"by unknown id", &csi.ListSnapshotsRequest{SnapshotId: "snap-ffffffffffffffff"}, nil},
		{"by source", &csi.ListSnapshotsRequest{SourceVolumeId: v1}, []string{s1.GetSnapshotId()}},
		{"by unknown source", &csi.ListSnapshotsRequest{SourceVolumeId: "vol-ffffffffffffffff"}, nil},
	}
	for _, tt := range listTests {
		t.Run("list "+tt.name, func(t *testing.T) {
			resp, err := d.ListSnapshots(t.Context(), tt.req)
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]bool{}
			for _, e := range resp.GetEntries() {
				got[e.GetSnapshot().GetSnapshotId()] = true
			}
			if len(got) != len(tt.want) {
				t.Fatalf("listed %v, want %v", got, tt.want)
			}
			for _, id := range tt.want {
				if !got[id] {
					t.Errorf("listed %v, want %v", got, tt.want)
				}
			}
		})
	}

	t.Run("list pages", func(t *testing.T) {
		first, err := d.ListSnapshots(t.Context(), &csi.ListSnapshotsRequest{MaxEntries: 1})
		if err != nil || len(first.GetEntries()) != 1 || first.GetNextToken() == "" {
			t.Fatalf("first page %v, %v; want one entry and a token", first, err)
		}
		rest, err := d.ListSnapshots(t.Context(), &csi.ListSnapshotsRequest{StartingToken: first.GetNextToken()})
		if err != nil || len(rest.GetEntries()) != 1 || rest.GetNextToken() != "" {
			t.Fatalf("second page %v, %v; want the other entry and no token", rest, err)
		}
		_, err = d.ListSnapshots(t.Context(), &csi.ListSnapshotsRequest{StartingToken: "invalid-token"})
		wantCode(t, err, codes.Aborted)
	})

	t.Run("delete", func(t *testing.T) {
		// The source volume can go first: snapshots are independent.
		if _, err := d.DeleteVolume(t.Context(), &csi.DeleteVolumeRequest{VolumeId: v1}); err != nil {
			t.Fatal(err)
		}
		for _, id := range []string{s1.GetSnapshotId(), s1.GetSnapshotId(), "snap-ffffffffffffffff"} {
			if _, err := d.DeleteSnapshot(t.Context(), &csi.DeleteSnapshotRequest{SnapshotId: id}); err != nil {
				t.Errorf("DeleteSnapshot(%s): %v", id, err)
			}
		}
		_, err := d.DeleteSnapshot(t.Context(), &csi.DeleteSnapshotRequest{})
		wantCode(t, err, codes.InvalidArgument)
		resp, err := d.ListSnapshots(t.Context(), &csi.ListSnapshotsRequest{})
		if err != nil || len(resp.GetEntries()) != 1 {
			t.Errorf("after deleting s1: %v, %v; want only s2", resp, err)
		}
		// The name is free again.
		if _, err := create("s1", v2); err != nil {
			t.Errorf("CreateSnapshot s1 after deleting it: %v", err)
		}
	})
}
