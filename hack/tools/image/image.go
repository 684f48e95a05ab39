package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Annotation keys of the OCI image spec and of containerd.
const (
	labelSource       = "org.opencontainers.image.source"
	labelVersion      = "org.opencontainers.image.version"
	labelRevision     = "org.opencontainers.image.revision"
	annotationRefName = "org.opencontainers.image.ref.name"
	// containerd (and so Docker's containerd image store, kind, ctr)
	// names an imported image after it.
	annotationImageName = "io.containerd.image.name"
)

// defaultPath is PATH in distroless and in Docker's default environment.
const defaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// platformImage is one platform's image of a program.
type platformImage struct {
	Platform platform
	Image    v1.Image
}

// result is what writeImage wrote.
type result struct {
	Name    string  // the image's name and tag, e.g. csi-provisioner:v1.2.3
	Digest  v1.Hash // the image index's digest
	Layout  string  // the OCI image layout directory
	Archive string  // the same layout as a tar
}

func labels(opts options) map[string]string {
	return map[string]string{
		labelSource:   opts.Source,
		labelVersion:  opts.Version,
		labelRevision: opts.Revision,
	}
}

// imageName is NAME:VERSION, under opts.Registry if set.
func imageName(opts options, prog program) string {
	if opts.Registry != "" {
		return opts.Registry + "/" + prog.Name + ":" + opts.Version
	}
	return prog.Name + ":" + opts.Version
}

// buildImage returns the one-layer image of prog for p: the binary and the
// files of rootfsEntries, run as nonroot with the binary as entrypoint, as
// the Dockerfiles' runtime stage.
func buildImage(opts options, prog program, p platform, binary string) (v1.Image, error) {
	raw, err := layerTar(rootfsEntries(prog.Name, binary), opts.Epoch)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(raw)), nil
	}, tarball.WithMediaType(types.OCILayer), tarball.WithCompressionLevel(gzip.DefaultCompression), tarball.WithCompressedCaching)
	if err != nil {
		return nil, err
	}
	img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err = mutate.Append(img, mutate.Addendum{
		Layer:     layer,
		MediaType: types.OCILayer,
		History: v1.History{
			Created:   v1.Time{Time: opts.Epoch},
			CreatedBy: fmt.Sprintf("hack/tools/image: go build %s, /%s", prog.Package, prog.Name),
		},
	})
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = p.OS, p.Arch
	cf.Created = v1.Time{Time: opts.Epoch}
	cf.Config = v1.Config{
		Entrypoint: []string{"/" + prog.Name},
		User:       nonrootUser,
		WorkingDir: nonrootHome,
		Env:        []string{defaultPath},
		Labels:     labels(opts),
	}
	return mutate.ConfigFile(img, cf)
}

// dockerManifest is one entry of the manifest.json of `docker save`, which
// Docker's classic image store needs to load an archive.
type dockerManifest struct {
	Config   string
	RepoTags []string
	Layers   []string
}

// writeImage joins imgs in an image index and writes it as an OCI image
// layout directory OUT/NAME and as the tar OUT/NAME.tar, replacing both.
func writeImage(opts options, prog program, imgs []platformImage) (result, error) {
	res := result{
		Name:    imageName(opts, prog),
		Layout:  filepath.Join(opts.OutDir, prog.Name),
		Archive: filepath.Join(opts.OutDir, prog.Name+".tar"),
	}
	adds := make([]mutate.IndexAddendum, 0, len(imgs))
	var manifests []dockerManifest
	for _, pi := range imgs {
		adds = append(adds, mutate.IndexAddendum{Add: pi.Image, Descriptor: v1.Descriptor{
			Platform: &v1.Platform{OS: pi.Platform.OS, Architecture: pi.Platform.Arch},
		}})
		m, err := dockerManifestOf(pi, res.Name, len(imgs) > 1)
		if err != nil {
			return res, err
		}
		manifests = append(manifests, m)
	}
	idx := mutate.AppendManifests(mutate.IndexMediaType(empty.Index, types.OCIImageIndex), adds...)
	idx, ok := mutate.Annotations(idx, labels(opts)).(v1.ImageIndex)
	if !ok {
		return res, fmt.Errorf("annotated index is not an index")
	}
	digest, err := idx.Digest()
	if err != nil {
		return res, err
	}
	res.Digest = digest

	if err := os.RemoveAll(res.Layout); err != nil {
		return res, err
	}
	lp, err := layout.Write(res.Layout, empty.Index)
	if err != nil {
		return res, err
	}
	if err := lp.AppendIndex(idx, layout.WithAnnotations(map[string]string{
		annotationRefName:   opts.Version,
		annotationImageName: res.Name,
	})); err != nil {
		return res, err
	}
	mj, err := json.Marshal(manifests)
	if err != nil {
		return res, err
	}
	if err := lp.WriteFile("manifest.json", mj, 0o644); err != nil {
		return res, err
	}
	return res, tarDir(res.Layout, res.Archive, opts)
}

// dockerManifestOf is pi's manifest.json entry. With several platforms each
// is tagged NAME-ARCH: Docker's classic store loads every entry, and one
// tag on all would name whichever came last.
func dockerManifestOf(pi platformImage, name string, perArch bool) (dockerManifest, error) {
	cfg, err := pi.Image.ConfigName()
	if err != nil {
		return dockerManifest{}, err
	}
	layers, err := pi.Image.Layers()
	if err != nil {
		return dockerManifest{}, err
	}
	m := dockerManifest{Config: blobPath(cfg), RepoTags: []string{name}}
	if perArch {
		m.RepoTags = []string{name + "-" + pi.Platform.Arch}
	}
	for _, l := range layers {
		d, err := l.Digest()
		if err != nil {
			return dockerManifest{}, err
		}
		m.Layers = append(m.Layers, blobPath(d))
	}
	return m, nil
}

func blobPath(h v1.Hash) string { return "blobs/" + h.Algorithm + "/" + h.Hex }

// tarDir writes the files under dir into the tar archive, in lexical
// order, owned by root, with fixed modes and opts.Epoch as every time.
func tarDir(dir, archive string, opts options) error {
	tmp := archive + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	defer func() { _ = os.Remove(tmp) }()
	tw := tar.NewWriter(f)
	err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || path == dir {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil {
			return err
		}
		hdr := &tar.Header{Name: filepath.ToSlash(rel), ModTime: opts.Epoch}
		if d.IsDir() {
			hdr.Typeflag, hdr.Name, hdr.Mode = tar.TypeDir, hdr.Name+"/", 0o755
			return tw.WriteHeader(hdr)
		}
		body, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		hdr.Typeflag, hdr.Mode, hdr.Size = tar.TypeReg, 0o644, int64(len(body))
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		_, err = tw.Write(body)
		return err
	})
	if err != nil {
		_ = f.Close()
		return fmt.Errorf("archive %s: %w", dir, err)
	}
	if err := tw.Close(); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, archive)
}
