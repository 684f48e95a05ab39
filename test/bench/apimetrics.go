package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"

	"k8s.io/client-go/kubernetes"
)

// requestKey is one series of kube-apiserver's apiserver_request_total,
// summed over API groups, scopes and the codes of requests the API server
// took.
type requestKey struct {
	Verb, Resource, Subresource string
	// Code is set for rejected requests only (HTTP 400 and above: 409
	// Conflict, 429 shed under load, 404, 5xx): they changed nothing, so
	// they are not writes, and are listed apart.
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
	return parseRequests(bytes.NewReader(raw))
}

// parseRequests reads apiserver_request_total from the text of /metrics.
func parseRequests(r io.Reader) (requestCounts, error) {
	out := requestCounts{}
	sc := bufio.NewScanner(r)
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
		k := requestKey{Verb: labels["verb"], Resource: labels["resource"], Subresource: labels["subresource"]}
		if rejected(labels["code"]) {
			k.Code = labels["code"]
		}
		out[k] += v
	}
	return out, sc.Err()
}

// rejected reports whether an HTTP status code (as a metric label) says the
// request was refused. A watch ends with code 0.
func rejected(code string) bool {
	n, err := strconv.Atoi(code)
	return err != nil || n >= 400
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

// volumeWrites sums the writes to PVCs and PVs the API server took
// (creates, updates, status updates, patches), the "object writes per
// volume" of the targets.
func (r requestCounts) volumeWrites() float64 {
	var n float64
	for k, v := range r {
		if k.Code == "" && isWrite(k.Verb) && k.Verb != "DELETE" && (k.Resource == "persistentvolumeclaims" || k.Resource == "persistentvolumes") {
			n += v
		}
	}
	return n
}

// events sums the event writes the API server took.
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
