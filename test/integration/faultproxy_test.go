package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/kube-storage/csi-provisioner/internal/controlplane"
)

// fault is what the proxy does to one request.
type fault string

const (
	faultNone fault = ""
	// fault429 answers 429 with Retry-After: 1, as API priority and
	// fairness does, without forwarding.
	fault429 fault = "429"
	// fault500 and fault503 answer without forwarding.
	fault500 fault = "500"
	fault503 fault = "503"
	// faultLost forwards the request, so that the API server makes the
	// change, and then closes the client's connection without an answer.
	faultLost fault = "lost"
	// faultGone answers a watch from a resourceVersion with 410 Gone, as
	// after an etcd compaction: the informer lists again.
	faultGone fault = "410"
	// faultCrash forwards the request, so that the API server makes the
	// change, then calls the proxy's crash function (which kills the
	// client) and closes the connection without an answer.
	faultCrash fault = "crash"
	// faultCrashBefore calls the crash function without forwarding the
	// request.
	faultCrashBefore fault = "crash-before"
)

// faultProxy is a plain-HTTP proxy to kube-apiserver, for one sidecar, that
// injects faults into its requests. Watches are cut after 1 to 3 s (the
// client watches again from where it was). Requests go on with the
// control plane's admin credentials.
type faultProxy struct {
	srv    *httptest.Server
	target string
	client *http.Client
	// decide picks the fault of a request; called under mu.
	decide func(r *http.Request, watch bool, rng *rand.Rand) fault

	// watches is the number of watches being proxied.
	watches atomic.Int32

	mu       sync.Mutex
	rng      *rand.Rand
	injected map[fault]int
	// writes lists the faults injected into writes, as "fault METHOD path".
	writes []string
	// crash is called by faultCrash and faultCrashBefore; once it has been,
	// the proxy forwards nothing more: the client is dead.
	crash   func()
	crashed atomic.Bool
}

// setCrash sets the function that faultCrash and faultCrashBefore call.
func (p *faultProxy) setCrash(crash func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.crash = crash
}

// startFaultProxy starts a proxy to cp whose faults decide picks, and
// returns it with a kubeconfig that points to it.
func startFaultProxy(t *testing.T, cp *controlplane.ControlPlane, seed uint64, decide func(r *http.Request, watch bool, rng *rand.Rand) fault) (*faultProxy, string) {
	t.Helper()
	rt, err := rest.TransportFor(cp.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	p := &faultProxy{target: cp.URL, client: &http.Client{Transport: rt}, decide: decide,
		rng: rand.New(rand.NewPCG(seed, seed)), injected: map[fault]int{}}
	p.srv = httptest.NewServer(http.HandlerFunc(p.serve))
	t.Cleanup(p.srv.Close)
	t.Logf("fault proxy seed %d", seed)

	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["proxy"] = &clientcmdapi.Cluster{Server: p.srv.URL}
	cfg.AuthInfos["proxy"] = &clientcmdapi.AuthInfo{}
	cfg.Contexts["proxy"] = &clientcmdapi.Context{Cluster: "proxy", AuthInfo: "proxy"}
	cfg.CurrentContext = "proxy"
	path := filepath.Join(t.TempDir(), "proxy.kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return p, path
}

// counts returns how many faults of each kind were injected.
func (p *faultProxy) counts() map[fault]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[fault]int, len(p.injected))
	for k, v := range p.injected {
		out[k] = v
	}
	return out
}

func (p *faultProxy) serve(w http.ResponseWriter, r *http.Request) {
	if p.crashed.Load() {
		// A request of the killed client that the proxy had not forwarded
		// yet dies with it.
		hangUp(w)
		return
	}
	watch := r.URL.Query().Get("watch") == "true" || r.URL.Query().Get("watch") == "1"
	p.mu.Lock()
	f := p.decide(r, watch, p.rng)
	cut := time.Second + time.Duration(p.rng.Int64N(int64(2*time.Second)))
	crash := p.crash
	if f != faultNone {
		p.injected[f]++
		if r.Method != http.MethodGet {
			p.writes = append(p.writes, fmt.Sprintf("%s %s %s", f, r.Method, r.URL.Path))
		}
	}
	p.mu.Unlock()
	switch f {
	case fault429:
		w.Header().Set("Retry-After", "1")
		writeStatus(w, http.StatusTooManyRequests, metav1.StatusReasonTooManyRequests)
		return
	case fault500:
		writeStatus(w, http.StatusInternalServerError, metav1.StatusReasonInternalError)
		return
	case fault503:
		writeStatus(w, http.StatusServiceUnavailable, metav1.StatusReasonServiceUnavailable)
		return
	case faultGone:
		writeStatus(w, http.StatusGone, metav1.StatusReasonExpired)
		return
	case faultCrashBefore:
		p.crashed.Store(true)
		crash()
		hangUp(w)
		return
	}
	ctx := r.Context()
	if watch {
		p.watches.Add(1)
		defer p.watches.Add(-1)
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cut)
		defer cancel()
	}
	out, err := http.NewRequestWithContext(ctx, r.Method, p.target+r.URL.RequestURI(), r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	out.Header = r.Header.Clone()
	out.ContentLength = r.ContentLength
	resp, err := p.client.Do(out)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer func() { _ = resp.Body.Close() }()
	if f == faultLost || f == faultCrash {
		_, _ = io.Copy(io.Discard, resp.Body)
		if f == faultCrash {
			p.crashed.Store(true)
			crash()
		}
		hangUp(w)
		return
	}
	for k, v := range resp.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(resp.StatusCode)
	rc := http.NewResponseController(w)
	buf := make([]byte, 32<<10)
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return
			}
			_ = rc.Flush()
		}
		if err != nil {
			// The end of the answer, or of a watch the proxy cuts: the
			// handler's return ends the response cleanly.
			return
		}
	}
}

// hangUp closes the client's connection without an answer.
func hangUp(w http.ResponseWriter) {
	if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
		_ = conn.Close()
	}
}

// writeStatus answers with a JSON metav1.Status, as kube-apiserver does.
func writeStatus(w http.ResponseWriter, code int, reason metav1.StatusReason) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(&metav1.Status{
		TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
		Status:   metav1.StatusFailure, Code: int32(code), Reason: reason,
		Message: fmt.Sprintf("injected by the test's fault proxy (%s)", strings.ToLower(string(reason))),
	})
}
