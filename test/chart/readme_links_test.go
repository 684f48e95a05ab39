package chart

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// TestReadmeLinks: every link of the project's READMEs to a section of the
// same page names a heading of that page, and every relative link names a
// file or directory that exists (and, with a #fragment, a heading of that
// file when it is Markdown). A renamed section or a moved file must not
// leave a reader at a dead link; a reviewer found one by hand.
func TestReadmeLinks(t *testing.T) {
	for _, page := range []string{"README.md", "deploy/sidecar/README.md", "examples/hostpath-driver/README.md"} {
		t.Run(page, func(t *testing.T) {
			path := repoPath(t, page)
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			links := markdownLinks(string(b))
			if page == "README.md" && len(links) == 0 {
				t.Fatalf("%s: no links found; the link pattern no longer matches the page", page)
			}
			for _, l := range links {
				if strings.Contains(l, "://") || strings.HasPrefix(l, "mailto:") {
					continue
				}
				target, fragment, _ := strings.Cut(l, "#")
				file := path
				if target != "" {
					file = filepath.Join(filepath.Dir(path), target)
					if _, err := os.Stat(file); err != nil {
						t.Errorf("%s links to %q, which does not exist", page, l)
						continue
					}
				}
				if fragment == "" || !strings.HasSuffix(file, ".md") {
					continue
				}
				doc, err := os.ReadFile(file)
				if err != nil {
					t.Fatal(err)
				}
				if !headingAnchors(string(doc))[fragment] {
					t.Errorf("%s links to %q: no heading of %s has that anchor", page, l, filepath.Base(file))
				}
			}
		})
	}
}

// TestHeadingAnchors pins the anchor rule TestReadmeLinks relies on (as
// GitHub renders headings).
func TestHeadingAnchors(t *testing.T) {
	doc := "# csi-provisioner\n## A broken class or a driver outage\n```\n## not a heading\n```\n" +
		"### `--node-deployment`: one sidecar per node\n## Flags\n## Flags\n"
	got := headingAnchors(doc)
	for _, want := range []string{"csi-provisioner", "a-broken-class-or-a-driver-outage", "--node-deployment-one-sidecar-per-node", "flags", "flags-1"} {
		if !got[want] {
			t.Errorf("no anchor %q in %v", want, got)
		}
	}
	if got["not-a-heading"] {
		t.Errorf("a line in a code block counted as a heading: %v", got)
	}
}

var linkPattern = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// markdownLinks returns the targets of the page's inline links, outside
// code blocks.
func markdownLinks(doc string) []string {
	var out []string
	for _, line := range proseLines(doc) {
		for _, m := range linkPattern.FindAllStringSubmatch(line, -1) {
			out = append(out, m[1])
		}
	}
	return out
}

// headingAnchors returns the anchors GitHub gives the page's headings:
// lower case, spaces to hyphens, punctuation other than hyphens and
// underscores dropped, and -1, -2... on repeats.
func headingAnchors(doc string) map[string]bool {
	anchors := map[string]bool{}
	seen := map[string]int{}
	for _, line := range proseLines(doc) {
		level := len(line) - len(strings.TrimLeft(line, "#"))
		if level == 0 || level > 6 || !strings.HasPrefix(line[level:], " ") {
			continue
		}
		var b strings.Builder
		for _, r := range strings.ToLower(strings.TrimSpace(line[level:])) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				b.WriteRune(r)
			}
		}
		a := b.String()
		if n := seen[a]; n > 0 {
			anchors[a+"-"+strconv.Itoa(n)] = true
		} else {
			anchors[a] = true
		}
		seen[a]++
	}
	return anchors
}

// proseLines returns the page's lines outside fenced code blocks.
func proseLines(doc string) []string {
	var out []string
	fenced := false
	for _, line := range strings.Split(doc, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		if !fenced {
			out = append(out, line)
		}
	}
	return out
}
