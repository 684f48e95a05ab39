package main

import (
	"errors"
	"flag"
	"io"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"
)

// FuzzFlags parses any argv (one argument per line) and validates the
// result. Invariants: no panic; every error is one line; a Config that
// validates makes valid PV names (prefix, dash and as much of a claim UID
// as --volume-name-uuid-length keeps), has a --metrics-path under / and
// valid --leader-election-labels.
func FuzzFlags(f *testing.F) {
	for _, seed := range []string{
		"",
		"--volume-name-prefix=pvc\n--volume-name-uuid-length=16",
		"--leader-election\n--leader-election-lease-duration=20s\n--leader-election-labels=a:b,c:d",
		"-v5\n--timeout\n5s\n--csi-address=unix:///run/csi.sock",
		"--http-endpoint=:8080\n--metrics-path=/m\n--feature-gates=Topology=false",
		"--leader-election\nfalse",
		"--kube-api-qps=-1\n--kube-api-burst=0\n--help",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, argv string) {
		var args []string
		if argv != "" {
			args = strings.Split(argv, "\n")
		}
		c, err := parseFlags(args, io.Discard)
		if err != nil {
			if !errors.Is(err, flag.ErrHelp) && strings.Contains(err.Error(), "\n") {
				t.Errorf("parse error is more than one line: %q", err)
			}
			return
		}
		resetLoggingAtCleanup(t)
		if err := c.Validate(); err != nil {
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("validation error is more than one line: %q", err)
			}
			return
		}
		uidLen := 36 // a UID with its dashes
		if c.VolumeNameUUIDLength >= 0 {
			uidLen = c.VolumeNameUUIDLength
		}
		name := c.VolumeNamePrefix + "-" + strings.Repeat("0", uidLen)
		if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
			t.Errorf("valid config names volumes like %q: %v", name, errs)
		}
		if !strings.HasPrefix(c.MetricsPath, "/") {
			t.Errorf("valid config serves metrics at %q", c.MetricsPath)
		}
		for k, v := range c.LeaderElectionLabels {
			if errs := append(validation.IsQualifiedName(k), validation.IsValidLabelValue(v)...); len(errs) > 0 {
				t.Errorf("valid config has lease label %q=%q: %v", k, v, errs)
			}
		}
	})
}
