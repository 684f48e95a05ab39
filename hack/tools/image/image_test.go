package main

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"debug/elf"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// testOptions builds both programs for this machine only: cross-compiling
// would compile every package again for the other architecture.
func testOptions(t *testing.T) options {
	t.Helper()
	if runtime.GOOS != "linux" || (runtime.GOARCH != "amd64" && runtime.GOARCH != "arm64") {
		t.Skipf("images are built for linux/amd64 and linux/arm64, not %s/%s", runtime.GOOS, runtime.GOARCH)
	}
	root, err := filepath.Abs("../../..")
	if err != nil {
		t.Fatal(err)
	}
	return options{
		RepoRoot:  root,
		OutDir:    t.TempDir(),
		Version:   "v0.0.0-imagetest",
		Revision:  "0123456789abcdef0123456789abcdef01234567",
		Source:    "https://github.com/kube-storage/csi-provisioner",
		Epoch:     time.Unix(1700000000, 0).UTC(),
		Platforms: []platform{{OS: "linux", Arch: runtime.GOARCH}},
		Programs:  programs,
	}
}

// TestImage builds both images for this machine as `make image` does, reads
// each archive back with go-containerregistry and checks what a container
// runtime would use: the index, the platform, the config (entrypoint, user,
// labels), the layer's files, modes and owners, and that the binary in the
// layer is static and runs. Then it builds again into another directory,
// compiling again, and wants the same digests and the same archive bytes.
func TestImage(t *testing.T) {
	opts := testOptions(t)
	start := time.Now()
	results := buildAll(t, opts)
	t.Logf("first build: %s", time.Since(start).Round(time.Millisecond))

	for _, prog := range opts.Programs {
		t.Run(prog.Name, func(t *testing.T) {
			res := results[prog.Name]
			dir := untar(t, res.archive)
			img := checkIndex(t, dir, opts, prog, res.digest)
			checkConfig(t, img, opts, prog)
			checkDockerManifest(t, dir, img, prog.Name+":"+opts.Version)
			bin := checkLayer(t, img, prog)
			out, err := exec.CommandContext(t.Context(), bin, "--version").CombinedOutput()
			if err != nil || !strings.Contains(string(out), opts.Version) {
				t.Errorf("%s --version: %v, output %q, want the version %s", prog.Name, err, out, opts.Version)
			}
		})
	}

	again := opts
	again.OutDir = t.TempDir()
	start = time.Now()
	results2 := buildAll(t, again)
	t.Logf("second build: %s", time.Since(start).Round(time.Millisecond))
	for _, prog := range opts.Programs {
		first, second := results[prog.Name], results2[prog.Name]
		if first.digest != second.digest {
			t.Errorf("%s: digest %s, then %s from the same inputs", prog.Name, first.digest, second.digest)
		}
		if a, b := fileSum(t, first.archive), fileSum(t, second.archive); a != b {
			t.Errorf("%s: archive sha256 %s, then %s from the same inputs", prog.Name, a, b)
		}
	}
}

type printed struct{ digest, archive string }

// buildAll runs the builder and parses its "NAME DIGEST ARCHIVE" lines.
func buildAll(t *testing.T, opts options) map[string]printed {
	t.Helper()
	var out bytes.Buffer
	if err := run(t.Context(), opts, &out); err != nil {
		t.Fatal(err)
	}
	results := map[string]printed{}
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 || !strings.HasPrefix(f[1], "sha256:") {
			t.Fatalf("output line %q, want NAME DIGEST ARCHIVE", line)
		}
		results[strings.Split(f[0], ":")[0]] = printed{digest: f[1], archive: f[2]}
	}
	if len(results) != len(opts.Programs) {
		t.Fatalf("output %q, want one line per program", out.String())
	}
	return results
}

// untar extracts an archive into a new directory, refusing paths that
// leave it.
func untar(t *testing.T, archive string) string {
	t.Helper()
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	dir := t.TempDir()
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return dir
		}
		if err != nil {
			t.Fatal(err)
		}
		if !filepath.IsLocal(hdr.Name) {
			t.Fatalf("archive entry %q is not a local path", hdr.Name)
		}
		p := filepath.Join(dir, hdr.Name)
		switch hdr.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(p, 0o755)
		case tar.TypeReg:
			var b []byte
			if b, err = io.ReadAll(tr); err == nil {
				err = os.WriteFile(p, b, 0o644)
			}
		default:
			t.Fatalf("archive entry %q has type %c", hdr.Name, hdr.Typeflag)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// checkIndex checks index.json (one image index, named for containerd and
// for OCI tools) and the image index (one manifest per platform, the
// labels as annotations), and returns the host platform's image.
func checkIndex(t *testing.T, dir string, opts options, prog program, digest string) v1.Image {
	t.Helper()
	lp, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		t.Fatalf("read OCI layout: %v", err)
	}
	top, err := lp.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(top.Manifests) != 1 {
		t.Fatalf("index.json has %d descriptors, want 1 (crane push takes a layout of one)", len(top.Manifests))
	}
	desc := top.Manifests[0]
	wantAnn := map[string]string{annotationRefName: opts.Version, annotationImageName: prog.Name + ":" + opts.Version}
	if desc.MediaType != types.OCIImageIndex || desc.Digest.String() != digest || !mapsEqual(desc.Annotations, wantAnn) {
		t.Errorf("index.json descriptor: %s %s %v, want %s %s %v", desc.MediaType, desc.Digest, desc.Annotations, types.OCIImageIndex, digest, wantAnn)
	}
	idx, err := lp.ImageIndex(desc.Digest)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if !mapsEqual(im.Annotations, labels(opts)) {
		t.Errorf("image index annotations %v, want %v", im.Annotations, labels(opts))
	}
	var platforms []string
	for _, m := range im.Manifests {
		if m.Platform == nil {
			t.Fatalf("manifest %s has no platform", m.Digest)
		}
		platforms = append(platforms, m.Platform.String())
	}
	if want := []string{"linux/" + runtime.GOARCH}; !slices.Equal(platforms, want) {
		t.Fatalf("platforms %v, want %v", platforms, want)
	}
	if im.Manifests[0].MediaType != types.OCIManifestSchema1 {
		t.Errorf("manifest media type %s, want %s", im.Manifests[0].MediaType, types.OCIManifestSchema1)
	}
	img, err := idx.Image(im.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// checkConfig checks the image config against the Dockerfiles' runtime
// stage: entrypoint, user, and the labels.
func checkConfig(t *testing.T, img v1.Image, opts options, prog program) {
	t.Helper()
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.OS != "linux" || cf.Architecture != runtime.GOARCH {
		t.Errorf("config platform %s/%s, want linux/%s", cf.OS, cf.Architecture, runtime.GOARCH)
	}
	if !cf.Created.Equal(opts.Epoch) {
		t.Errorf("created %s, want %s", cf.Created.Time, opts.Epoch)
	}
	c := cf.Config
	if want := []string{"/" + prog.Name}; !slices.Equal(c.Entrypoint, want) || len(c.Cmd) != 0 {
		t.Errorf("entrypoint %q cmd %q, want %q and no cmd", c.Entrypoint, c.Cmd, want)
	}
	if c.User != "65532:65532" || c.WorkingDir != "/home/nonroot" {
		t.Errorf("user %q workdir %q, want 65532:65532 and /home/nonroot", c.User, c.WorkingDir)
	}
	want := map[string]string{
		"org.opencontainers.image.source":   opts.Source,
		"org.opencontainers.image.version":  opts.Version,
		"org.opencontainers.image.revision": opts.Revision,
	}
	if !mapsEqual(c.Labels, want) {
		t.Errorf("labels %v, want %v", c.Labels, want)
	}
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	if m.Config.MediaType != types.OCIConfigJSON || len(m.Layers) != 1 || m.Layers[0].MediaType != types.OCILayer {
		t.Errorf("manifest: config %s, %d layers %v; want %s and one %s", m.Config.MediaType, len(m.Layers), m.Layers, types.OCIConfigJSON, types.OCILayer)
	}
}

// checkDockerManifest checks manifest.json, which Docker's classic image
// store loads: it names the image's config and layer blobs and the tag.
func checkDockerManifest(t *testing.T, dir string, img v1.Image, tag string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "manifest.json"))
	if err != nil {
		t.Fatal(err)
	}
	var ms []dockerManifest
	if err := json.Unmarshal(b, &ms); err != nil {
		t.Fatalf("manifest.json: %v", err)
	}
	cfg, err := img.ConfigName()
	if err != nil {
		t.Fatal(err)
	}
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	want := dockerManifest{Config: blobPath(cfg), RepoTags: []string{tag}, Layers: []string{blobPath(m.Layers[0].Digest)}}
	if len(ms) != 1 || fmt.Sprint(ms[0]) != fmt.Sprint(want) {
		t.Errorf("manifest.json %+v, want [%+v]", ms, want)
	}
	for _, f := range []string{want.Config, want.Layers[0]} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Errorf("manifest.json names a missing blob: %v", err)
		}
	}
}

// checkLayer compares the layer's entries (type, mode, owner, name, and
// time) with testdata/NAME.rootfs, checks the account files, and returns
// the binary, extracted and checked to be a static ELF executable.
func checkLayer(t *testing.T, img v1.Image, prog program) string {
	t.Helper()
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rc.Close() }()
	var listing strings.Builder
	files := map[string][]byte{}
	tr := tar.NewReader(rc)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&listing, "%s %d:%d %s %s\n", hdr.FileInfo().Mode(), hdr.Uid, hdr.Gid, hdr.ModTime.UTC().Format(time.RFC3339), hdr.Name)
		if hdr.Typeflag == tar.TypeReg {
			if files[hdr.Name], err = io.ReadAll(tr); err != nil {
				t.Fatal(err)
			}
		}
	}
	golden(t, filepath.Join("testdata", prog.Name+".rootfs"), listing.String())
	if p := string(files["etc/passwd"]); !strings.Contains(p, "\nnonroot:x:65532:65532:nonroot:/home/nonroot:") {
		t.Errorf("/etc/passwd does not name uid 65532 nonroot:\n%s", p)
	}
	if g := string(files["etc/group"]); !strings.Contains(g, "\nnonroot:x:65532:") {
		t.Errorf("/etc/group does not name gid 65532 nonroot:\n%s", g)
	}
	bin := filepath.Join(t.TempDir(), prog.Name)
	if err := os.WriteFile(bin, files[prog.Name], 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatalf("/%s is not an ELF binary: %v", prog.Name, err)
	}
	defer func() { _ = f.Close() }()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Errorf("/%s is dynamically linked (has %s): an empty base has no libc", prog.Name, p.Type)
		}
	}
	return bin
}

// golden compares got with the file, or rewrites it under -update.
func golden(t *testing.T, path, got string) {
	t.Helper()
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (go test -run TestImage -update writes it)", err)
	}
	if got != string(want) {
		t.Errorf("layer of %s differs from %s (-update rewrites it):\ngot:\n%s\nwant:\n%s", filepath.Base(path), path, got, want)
	}
}

func fileSum(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%x", sha256.Sum256(b))
}

func mapsEqual(a, b map[string]string) bool {
	return fmt.Sprint(a) == fmt.Sprint(b) // fmt sorts map keys
}
