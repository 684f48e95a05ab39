package main

import (
	"bufio"
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"k8s.io/client-go/kubernetes"
)

// requestKey is one series of kube-apiserver's apiserver_request_total,
// summed over codes and scopes.
type requestKey struct {
	Verb, Resource, Subresource string
	// Code is set only for rejected writes (HTTP 409 Conflict).
	Code string
}

func (k requestKey) String() string {
	r := k.Resource
	if k.Subresource != "" {
		r += "/" + k.Subresource
	}
	if k.Code != "" {
		r += " (" + k.Code + ")"
	}
	return k.Verb + " " + r
}

// requestCounts maps request kinds to their count.
type requestCounts map[requestKey]float64

// scrapeRequests reads apiserver_request_total from kube-apiserver's /metrics.
func scrapeRequests(ctx context.Context, c kubernetes.Interface) (requestCounts, error) {
	raw, err := c.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("scrape kube-apiserver metrics: %w", err)
	}
	out := requestCounts{}
	sc := bufio.NewScanner(strings.NewReader(string(raw)))
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "apiserver_request_total{") {
			continue
		}
		end := strings.LastIndex(line, "}")
		labels := parseLabels(line[len("apiserver_request_total{"):end])
		v, err := strconv.ParseFloat(strings.TrimSpace(line[end+1:]), 64)
		if err != nil {
			continue
		}
		out[requestKey{Verb: labels["verb"], Resource: labels["resource"], Subresource: labels["subresource"]}] += v
		if labels["code"] == "409" {
			out[requestKey{Verb: labels["verb"], Resource: labels["resource"], Subresource: labels["subresource"], Code: "409"}] += v
		}
	}
	return out, sc.Err()
}

func parseLabels(s string) map[string]string {
	m := map[string]string{}
	for len(s) > 0 {
		eq := strings.Index(s, "=\"")
		if eq < 0 {
			break
		}
		key := strings.TrimLeft(s[:eq], ",")
		rest := s[eq+2:]
		endq := strings.Index(rest, "\"")
		if endq < 0 {
			break
		}
		m[key] = rest[:endq]
		s = rest[endq+1:]
	}
	return m
}

// diff returns after − before, dropping zero entries.
func (r requestCounts) diff(before requestCounts) requestCounts {
	out := requestCounts{}
	for k, v := range r {
		if d := v - before[k]; d > 0 {
			out[k] = d
		}
	}
	return out
}

// isWrite reports whether the verb changes an object.
func isWrite(verb string) bool {
	switch verb {
	case "POST", "PUT", "PATCH", "DELETE", "APPLY", "DELETECOLLECTION":
		return true
	}
	return false
}

// volumeWrites sums the writes to PVCs and PVs (creates, updates, status
// updates, patches), the "object writes per volume" of the targets.
func (r requestCounts) volumeWrites() float64 {
	var n float64
	for k, v := range r {
		if k.Code == "" && isWrite(k.Verb) && k.Verb != "DELETE" && (k.Resource == "persistentvolumeclaims" || k.Resource == "persistentvolumes") {
			n += v
		}
	}
	return n
}

// events sums event writes.
func (r requestCounts) events() float64 {
	var n float64
	for k, v := range r {
		if k.Code == "" && isWrite(k.Verb) && k.Resource == "events" {
			n += v
		}
	}
	return n
}

// sorted lists the entries by count, largest first.
func (r requestCounts) sorted() []requestKey {
	keys := make([]requestKey, 0, len(r))
	for k := range r {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if r[keys[i]] != r[keys[j]] {
			return r[keys[i]] > r[keys[j]]
		}
		return keys[i].String() < keys[j].String()
	})
	return keys
}
