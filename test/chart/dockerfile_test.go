package chart

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestDockerfiles checks the two Dockerfiles without a Docker engine: a Go
// builder at the go.mod's Go version, a static build of the right package
// with the version stamped, the distroless nonroot runtime, the nonroot
// user and the binary as entrypoint.
func TestDockerfiles(t *testing.T) {
	goMod, err := os.ReadFile(repoPath(t, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	goVersion := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindSubmatch(goMod)
	if goVersion == nil {
		t.Fatal("go.mod has no go directive")
	}
	for _, tc := range []struct{ file, pkg, binary string }{
		{"Dockerfile", "./cmd/csi-provisioner", "csi-provisioner"},
		{"examples/hostpath-driver/Dockerfile", "./examples/hostpath-driver", "hostpath-driver"},
	} {
		t.Run(tc.file, func(t *testing.T) {
			b, err := os.ReadFile(repoPath(t, tc.file))
			if err != nil {
				t.Fatal(err)
			}
			// Join continuation lines and drop comments.
			text := strings.ReplaceAll(string(b), "\\\n", " ")
			var lines []string
			for _, l := range strings.Split(text, "\n") {
				if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
					lines = append(lines, strings.Join(strings.Fields(l), " "))
				}
			}
			var froms []string
			for _, l := range lines {
				if strings.HasPrefix(l, "FROM ") {
					froms = append(froms, l)
				}
			}
			wantFroms := []string{
				"FROM --platform=$BUILDPLATFORM golang:" + string(goVersion[1]) + " AS build",
				"FROM gcr.io/distroless/static-debian12:nonroot",
			}
			if strings.Join(froms, "\n") != strings.Join(wantFroms, "\n") {
				t.Errorf("stages:\n%s\nwant:\n%s", strings.Join(froms, "\n"), strings.Join(wantFroms, "\n"))
			}
			build := ""
			for _, l := range lines {
				if strings.Contains(l, "go build") {
					build = l
				}
			}
			for _, want := range []string{"CGO_ENABLED=0", "-trimpath", "-tags grpcnotrace", `-X main.version=${VERSION}`, "-o /out/" + tc.binary + " " + tc.pkg} {
				if !strings.Contains(build, want) {
					t.Errorf("go build line %q lacks %q", build, want)
				}
			}
			tail := lines[len(lines)-3:]
			wantTail := []string{
				"COPY --from=build /out/" + tc.binary + " /" + tc.binary,
				"USER 65532:65532",
				`ENTRYPOINT ["/` + tc.binary + `"]`,
			}
			if strings.Join(tail, "\n") != strings.Join(wantTail, "\n") {
				t.Errorf("runtime stage ends with:\n%s\nwant:\n%s", strings.Join(tail, "\n"), strings.Join(wantTail, "\n"))
			}
		})
	}
}
