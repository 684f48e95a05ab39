package main

import (
	"bytes"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"
)

// otherProgramsFlags are the flags the pages' prose names that belong to
// other programs or to the flag package.
var otherProgramsFlags = map[string]bool{
	"event-ttl":        true, // kube-apiserver
	"runtime-config":   true, // kube-apiserver
	"strict":           true, // helm lint (make chart)
	"help":             true, // the flag package's own
	"resource-version": true, // kubectl annotate
	"all":              true, // skopeo copy (make image)
}

// readmeFlagRow is one row of a flag table of README.md: the flags of its
// first cell and the text of its default's cell.
type readmeFlagRow struct {
	flags []string
	def   string
}

var (
	readmeFlagRe = regexp.MustCompile("`(--?[a-z][a-z0-9-]*)`")
	anyFlagRe    = regexp.MustCompile(`(?:^|[\s(` + "`" + `])--([a-z][a-z0-9-]*)`)
	codeBlockRe  = regexp.MustCompile("(?ms)^```.*?^```")
)

// readmeFlagTable returns the table rows of README.md's section under
// heading whose first cell names a flag, with the text of cell defCol.
func readmeFlagTable(t *testing.T, readme, heading string, defCol int) []readmeFlagRow {
	t.Helper()
	_, section, ok := strings.Cut(readme, "\n"+heading+"\n")
	if !ok {
		t.Fatalf("README.md has no %q section", heading)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	var rows []readmeFlagRow
	for _, line := range strings.Split(section, "\n") {
		cells := strings.Split(line, "|")
		if !strings.HasPrefix(line, "| `-") || len(cells) <= defCol+1 {
			continue
		}
		var row readmeFlagRow
		for _, m := range readmeFlagRe.FindAllStringSubmatch(cells[1], -1) {
			row.flags = append(row.flags, strings.TrimLeft(m[1], "-"))
		}
		row.def = strings.TrimSpace(cells[defCol+1])
		rows = append(rows, row)
	}
	if len(rows) == 0 {
		t.Fatalf("README.md's %q section has no flag table", heading)
	}
	return rows
}

// sameDefault reports whether the README's word for a default (off, on,
// 10s, `text`, 1m) is the flag's default value.
func sameDefault(doc, def string) bool {
	doc = strings.Trim(strings.TrimSpace(doc), "`")
	if doc == def {
		return true
	}
	switch doc {
	case "off":
		return def == "false" || def == ""
	case "on":
		return def == "true"
	}
	d1, err1 := time.ParseDuration(doc)
	d2, err2 := time.ParseDuration(def)
	return err1 == nil && err2 == nil && d1 == d2
}

// TestReadmeFlags keeps README.md honest about the flags: the Flags table
// and the table of defaults that differ from upstream name existing flags
// with their real defaults, and every other --flag its prose, and that of
// deploy/sidecar/README.md, names exists (code blocks hold helm's and
// drivers' flags).
func TestReadmeFlags(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	fs := newConfig().flagSet(&bytes.Buffer{})
	// check compares a table's rows with the flags: one default for all
	// the flags of a row, or one each, separated by sep.
	check := func(table string, rows []readmeFlagRow, sep string) {
		for _, row := range rows {
			defs := strings.Split(row.def, sep)
			if len(defs) != len(row.flags) {
				defs = []string{row.def}
			}
			for i, name := range row.flags {
				def := defs[min(i, len(defs)-1)]
				f := fs.Lookup(name)
				switch {
				case f == nil:
					t.Errorf("README.md's %s table names --%s, which is no flag", table, name)
				case row.def != "" && !sameDefault(def, f.DefValue):
					t.Errorf("README.md's %s table gives --%s the default %q; it is %q", table, name, def, f.DefValue)
				}
			}
		}
	}
	check("Flags", readmeFlagTable(t, readme, "## Flags", 1), ",")
	check("Defaults that differ from upstream", readmeFlagTable(t, readme, "## Defaults that differ from upstream", 2), "/")

	chart, err := os.ReadFile("../../deploy/sidecar/README.md")
	if err != nil {
		t.Fatal(err)
	}
	for page, text := range map[string]string{"README.md": readme, "deploy/sidecar/README.md": string(chart)} {
		for _, m := range anyFlagRe.FindAllStringSubmatch(codeBlockRe.ReplaceAllString(text, ""), -1) {
			if name := m[1]; fs.Lookup(name) == nil && !otherProgramsFlags[name] {
				t.Errorf("%s names --%s, which is no flag", page, name)
			}
		}
	}
}
