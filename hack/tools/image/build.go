package main

import (
	"bytes"
	"context"
	"debug/buildinfo"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// compile builds prog for p into OUT/OS-ARCH/NAME with the Dockerfiles'
// flags and returns the binary's path. Go's build cache makes a second run
// with the same sources only a link. The microarchitecture levels are set
// to Go's defaults so that a GOAMD64 or GOARM64 in the caller's environment
// cannot change the image.
func compile(ctx context.Context, opts options, prog program, p platform) (string, error) {
	out, err := filepath.Abs(filepath.Join(opts.OutDir, p.OS+"-"+p.Arch, prog.Name))
	if err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-buildvcs=false", "-tags", buildTags,
		"-ldflags", "-s -w -X main.version="+opts.Version, "-o", out, prog.Package)
	cmd.Dir = opts.RepoRoot
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS="+p.OS, "GOARCH="+p.Arch,
		"GOAMD64=v1", "GOARM64=v8.0", "GOFLAGS=", "GOEXPERIMENT=")
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("go build %s for %s: %w\n%s", prog.Package, p, err, stderr.String())
	}
	if err := checkBinary(out, p); err != nil {
		return "", err
	}
	return out, nil
}

// buildTags are the Makefile's GOTAGS (see the reason there).
const buildTags = "grpcnotrace"

// elfMachine is the ELF machine of each supported GOARCH.
var elfMachine = map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}

// checkBinary fails unless path is a static Linux ELF binary for p, built
// by Go with cgo off, -trimpath and stripped: what an empty base image can
// run. (With -trimpath the build info omits -ldflags, so main.version is
// checked by running the binary, in the test.)
func checkBinary(path string, p platform) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("check %s: %w", path, err)
	}
	defer func() { _ = f.Close() }()
	var problems []string
	if want := elfMachine[p.Arch]; f.Machine != want {
		problems = append(problems, fmt.Sprintf("machine %s, want %s", f.Machine, want))
	}
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			problems = append(problems, "has a program interpreter (dynamically linked)")
		}
	}
	if libs, err := f.ImportedLibraries(); err == nil && len(libs) > 0 {
		problems = append(problems, fmt.Sprintf("needs shared libraries %v", libs))
	}
	if f.Section(".symtab") != nil {
		problems = append(problems, "not stripped (.symtab present; want -ldflags -s)")
	}
	info, err := buildinfo.ReadFile(path)
	if err != nil {
		return fmt.Errorf("check %s: read build info: %w", path, err)
	}
	settings := map[string]string{}
	for _, s := range info.Settings {
		settings[s.Key] = s.Value
	}
	for key, want := range map[string]string{"CGO_ENABLED": "0", "-trimpath": "true", "-tags": buildTags, "GOOS": p.OS, "GOARCH": p.Arch} {
		if settings[key] != want {
			problems = append(problems, fmt.Sprintf("built with %s=%q, want %q", key, settings[key], want))
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("check %s: %w", path, errors.New(strings.Join(problems, "; ")))
	}
	return nil
}
