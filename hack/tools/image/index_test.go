package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/layout"
)

// TestTwoPlatforms writes the index of both platforms, as `make image` does,
// without cross-compiling (buildImage does not look inside the binary): one
// manifest per platform whose config names that platform, and in
// manifest.json one entry per platform, tagged NAME:VERSION-ARCH so that
// Docker's classic store, which loads every entry, keeps both apart.
func TestTwoPlatforms(t *testing.T) {
	opts := options{
		OutDir: t.TempDir(), Version: "v1.2.3", Revision: "abc", Source: "https://example.com/src",
		Registry: "registry.example.com/acme", Epoch: time.Unix(0, 0).UTC(),
	}
	prog := program{Name: "csi-provisioner"}
	bin := filepath.Join(t.TempDir(), "csi-provisioner")
	if err := os.WriteFile(bin, []byte("a binary"), 0o755); err != nil {
		t.Fatal(err)
	}
	var imgs []platformImage
	for _, arch := range []string{"amd64", "arm64"} {
		p := platform{OS: "linux", Arch: arch}
		img, err := buildImage(opts, prog, p, bin)
		if err != nil {
			t.Fatal(err)
		}
		imgs = append(imgs, platformImage{Platform: p, Image: img})
	}
	res, err := writeImage(opts, prog, imgs)
	if err != nil {
		t.Fatal(err)
	}
	if want := "registry.example.com/acme/csi-provisioner:v1.2.3"; res.Name != want {
		t.Errorf("name %q, want %q", res.Name, want)
	}

	dir := untar(t, res.Archive)
	lp, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := lp.ImageIndex(res.Digest)
	if err != nil {
		t.Fatalf("index.json does not hold the printed digest %s: %v", res.Digest, err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range im.Manifests {
		img, err := idx.Image(m.Digest)
		if err != nil {
			t.Fatal(err)
		}
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, fmt.Sprintf("%s config %s/%s", m.Platform, cf.OS, cf.Architecture))
	}
	if want := []string{"linux/amd64 config linux/amd64", "linux/arm64 config linux/arm64"}; !slices.Equal(got, want) {
		t.Errorf("index: %q, want %q", got, want)
	}

	b, err := os.ReadFile(filepath.Join(dir, "manifest.json"))
	if err != nil {
		t.Fatal(err)
	}
	var ms []dockerManifest
	if err := json.Unmarshal(b, &ms); err != nil {
		t.Fatal(err)
	}
	got = nil
	for _, m := range ms {
		got = append(got, m.RepoTags...)
	}
	if want := []string{res.Name + "-amd64", res.Name + "-arm64"}; !slices.Equal(got, want) {
		t.Errorf("manifest.json tags %q, want %q", got, want)
	}
}

func TestParseFlags(t *testing.T) {
	host := "linux/" + runtime.GOARCH
	for _, tc := range []struct {
		name    string
		args    []string
		env     string // SOURCE_DATE_EPOCH
		want    string // platforms and epoch, or the error
		wantErr bool
	}{
		{name: "defaults", want: "[linux/amd64 linux/arm64] 1970-01-01T00:00:00Z"},
		{name: "SOURCE_DATE_EPOCH", env: "1700000000", want: "[linux/amd64 linux/arm64] 2023-11-14T22:13:20Z"},
		{name: "flag over env", args: []string{"-source-date-epoch", "60"}, env: "1700000000", want: "[linux/amd64 linux/arm64] 1970-01-01T00:01:00Z"},
		{name: "host", args: []string{"-platforms", "host"}, want: "[" + host + "] 1970-01-01T00:00:00Z"},
		{name: "unsupported platform", args: []string{"-platforms", "linux/s390x"}, wantErr: true},
		{name: "bad epoch", env: "yesterday", wantErr: true},
		{name: "version not a tag", args: []string{"-version", "v1 dirty"}, wantErr: true},
		{name: "extra argument", args: []string{"csi-provisioner"}, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, err := parseFlags(tc.args, tc.env)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err %v, want error %v", err, tc.wantErr)
			}
			if err != nil {
				return
			}
			if got := fmt.Sprintf("%v %s", o.Platforms, o.Epoch.Format(time.RFC3339)); got != tc.want {
				t.Errorf("got %s, want %s", got, tc.want)
			}
		})
	}
}
