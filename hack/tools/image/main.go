// Command image builds the csi-provisioner and hostpath-driver container
// images without a container engine: `make image` runs it.
//
// For each program and platform it cross-compiles the static binary exactly
// as the Dockerfiles do (CGO_ENABLED=0, -trimpath, -buildvcs=false,
// -ldflags "-s -w -X main.version=VERSION"), puts it in a one-layer image on
// an empty base (no base image is pulled: the layer carries the few files
// distroless/static:nonroot provides that the programs or tools may read,
// /etc/passwd, /etc/group, /etc/nsswitch.conf, /home/nonroot and /tmp), and
// joins the platforms in an OCI image index. It writes, per program:
//
//	OUT/NAME/      an OCI image layout directory (crane push, skopeo oci:)
//	OUT/NAME.tar   the same layout as a tar (podman load, skopeo
//	               oci-archive:, docker load), with a Docker manifest.json
//	               so that Docker's classic image store loads it too
//
// and prints "NAME DIGEST PATH", DIGEST being the image index's digest.
//
// Every timestamp is fixed (-source-date-epoch, default $SOURCE_DATE_EPOCH
// or 0) and every file is written in a fixed order with fixed owners and
// modes, so the same source, Go toolchain and flags give the same digest.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// programs are the two images the repository ships: the binary's name
// (also the image's name and entrypoint) and its package.
var programs = []program{
	{Name: "csi-provisioner", Package: "./cmd/csi-provisioner"},
	{Name: "hostpath-driver", Package: "./examples/hostpath-driver"},
}

// program is one image to build.
type program struct {
	Name    string
	Package string
}

// platform is a GOOS/GOARCH pair.
type platform struct {
	OS, Arch string
}

func (p platform) String() string { return p.OS + "/" + p.Arch }

// options is what one run builds.
type options struct {
	RepoRoot  string // the checkout, where go build runs
	OutDir    string
	Version   string // main.version, the tag and the version label
	Revision  string // the revision label
	Source    string // the source label
	Registry  string // prefix of the image names, e.g. registry.example.com/acme
	Epoch     time.Time
	Platforms []platform
	Programs  []program
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	opts, err := parseFlags(os.Args[1:], os.Getenv("SOURCE_DATE_EPOCH"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if err := run(ctx, opts, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

func parseFlags(args []string, sourceDateEpoch string) (options, error) {
	fs := flag.NewFlagSet("image", flag.ContinueOnError)
	o := options{Programs: programs}
	fs.StringVar(&o.RepoRoot, "repo-root", ".", "The checkout to build from.")
	fs.StringVar(&o.OutDir, "out", "bin/images", "Where to write the binaries, the layouts and the archives.")
	fs.StringVar(&o.Version, "version", "dev", "Stamped as main.version; the image tag and the org.opencontainers.image.version label.")
	fs.StringVar(&o.Revision, "revision", "unknown", "The org.opencontainers.image.revision label (the git commit).")
	fs.StringVar(&o.Source, "source", "https://github.com/kube-storage/csi-provisioner", "The org.opencontainers.image.source label.")
	fs.StringVar(&o.Registry, "registry", "", "Prefix of the image names in the archives, e.g. registry.example.com/acme; empty: csi-provisioner:VERSION.")
	platforms := fs.String("platforms", "linux/amd64,linux/arm64", "Comma-separated GOOS/GOARCH list; \"host\" is this machine's.")
	epoch := fs.String("source-date-epoch", sourceDateEpoch, "Seconds since 1970 for every timestamp (default $SOURCE_DATE_EPOCH, else 0).")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() != 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	secs := int64(0)
	if *epoch != "" {
		var err error
		if secs, err = strconv.ParseInt(*epoch, 10, 64); err != nil {
			return o, fmt.Errorf("-source-date-epoch %q: %w", *epoch, err)
		}
	}
	o.Epoch = time.Unix(secs, 0).UTC()
	for _, s := range strings.Split(*platforms, ",") {
		if s == "host" {
			s = runtime.GOOS + "/" + runtime.GOARCH
		}
		goos, goarch, ok := strings.Cut(s, "/")
		if !ok || goos != "linux" || (goarch != "amd64" && goarch != "arm64") {
			return o, fmt.Errorf("-platforms: %q is not linux/amd64 or linux/arm64", s)
		}
		o.Platforms = append(o.Platforms, platform{OS: goos, Arch: goarch})
	}
	if strings.ContainsAny(o.Version, " :/@") || o.Version == "" {
		return o, fmt.Errorf("-version %q is not usable as an image tag", o.Version)
	}
	return o, nil
}

// run builds every program for every platform and writes its layout and
// archive under opts.OutDir, printing one line per image to stdout.
func run(ctx context.Context, opts options, stdout io.Writer) error {
	for _, prog := range opts.Programs {
		var imgs []platformImage
		for _, p := range opts.Platforms {
			bin, err := compile(ctx, opts, prog, p)
			if err != nil {
				return err
			}
			img, err := buildImage(opts, prog, p, bin)
			if err != nil {
				return fmt.Errorf("image %s for %s: %w", prog.Name, p, err)
			}
			imgs = append(imgs, platformImage{Platform: p, Image: img})
		}
		res, err := writeImage(opts, prog, imgs)
		if err != nil {
			return fmt.Errorf("write image %s: %w", prog.Name, err)
		}
		if _, err := fmt.Fprintf(stdout, "%s %s %s\n", res.Name, res.Digest, res.Archive); err != nil {
			return err
		}
	}
	return nil
}
