package main

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"
)

// nonroot is the user and group the Dockerfiles run as (USER 65532:65532),
// named as in distroless.
const (
	nonrootID   = 65532
	nonrootUser = "65532:65532"
	nonrootHome = "/home/nonroot"
)

// The account files of distroless/static: some libraries and tools look
// the running uid up by name (os/user, ssh, git, a shell's prompt).
const (
	passwd = "root:x:0:0:root:/root:/sbin/nologin\n" +
		"nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n" +
		"nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"
	group = "root:x:0:\n" +
		"nobody:x:65534:\n" +
		"nonroot:x:65532:\n"
	// Go's resolver reads it; without it the order of /etc/hosts and DNS
	// is Go's guess.
	nsswitch = "hosts: files dns\n"
)

// entry is one file or directory of the layer.
type entry struct {
	Name     string // relative, no leading slash; directories end in /
	Mode     int64
	UID, GID int
	Body     []byte // nil for a directory
	File     string // read the body from this file instead
}

// rootfsEntries lists the layer of prog in the order it is written: parents
// before children, by name, so the same inputs give the same bytes.
func rootfsEntries(name, binary string) []entry {
	entries := []entry{
		{Name: name, Mode: 0o755, File: binary},
		{Name: "etc/", Mode: 0o755},
		{Name: "etc/group", Mode: 0o644, Body: []byte(group)},
		{Name: "etc/nsswitch.conf", Mode: 0o644, Body: []byte(nsswitch)},
		{Name: "etc/passwd", Mode: 0o644, Body: []byte(passwd)},
		{Name: "home/", Mode: 0o755},
		{Name: "home/nonroot/", Mode: 0o700, UID: nonrootID, GID: nonrootID},
		// Sticky and world-writable, as everywhere: a program or library
		// that writes a temporary file (os.CreateTemp) needs it.
		{Name: "tmp/", Mode: 0o1777},
	}
	slices.SortFunc(entries, func(a, b entry) int { return strings.Compare(a.Name, b.Name) })
	return entries
}

// layerTar returns the uncompressed tar of entries, every timestamp epoch.
func layerTar(entries []entry, epoch time.Time) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		hdr := &tar.Header{
			Name: e.Name, Mode: e.Mode, Uid: e.UID, Gid: e.GID,
			ModTime: epoch,
		}
		body := e.Body
		if e.File != "" {
			b, err := os.ReadFile(e.File)
			if err != nil {
				return nil, fmt.Errorf("layer entry %s: %w", e.Name, err)
			}
			body = b
		}
		if body == nil && e.File == "" {
			hdr.Typeflag = tar.TypeDir
		} else {
			hdr.Typeflag = tar.TypeReg
			hdr.Size = int64(len(body))
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, fmt.Errorf("layer entry %s: %w", e.Name, err)
		}
		if _, err := io.Copy(tw, bytes.NewReader(body)); err != nil {
			return nil, fmt.Errorf("layer entry %s: %w", e.Name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
