package badinput

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-storage/csi-provisioner/internal/testutil"
)

// TestSecretsNotLogged provisions and deletes a volume with provisioner,
// node-stage and node-publish secrets, the sidecar at -v=10 in each log
// format and the driver at -v=5, and searches every log line of both for
// each secret value: plain, base64-encoded, and in the hex dumps client-go
// writes of protobuf bodies from -v=8. It also searches the namespace's
// events and the PV. The driver requires the provisioner secret for
// CreateVolume and DeleteVolume, so the test only passes if the secret
// really went through.
func TestSecretsNotLogged(t *testing.T) {
	for _, format := range []string{"text", "json"} {
		t.Run(format, func(t *testing.T) { testSecretsNotLogged(t, format) })
	}
}

func testSecretsNotLogged(t *testing.T, format string) {
	value := func(kind string) string {
		b := make([]byte, 12)
		_, _ = rand.Read(b)
		return kind + "-" + hex.EncodeToString(b)
	}
	prov, stage, publish := value("prov"), value("stage"), value("publish")
	s := newStack(t, "secrets-"+format,
		[]string{"-v=5", "--require-create-secret=token=" + prov, "--require-delete-secret=token=" + prov},
		[]string{"-v=10", "--logging-format=" + format})
	ctx := t.Context()
	for name, v := range map[string]string{"prov": prov, "stage": stage, "publish": publish} {
		sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name}, StringData: map[string]string{"token": v}}
		if _, err := s.c.CoreV1().Secrets(s.ns).Create(ctx, sec, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	sc := s.class(t, "secrets-"+format, func(sc *storagev1.StorageClass) {
		sc.Parameters = map[string]string{
			"csi.storage.k8s.io/provisioner-secret-name":       "prov",
			"csi.storage.k8s.io/provisioner-secret-namespace":  "${pvc.namespace}",
			"csi.storage.k8s.io/node-stage-secret-name":        "stage",
			"csi.storage.k8s.io/node-stage-secret-namespace":   "${pvc.namespace}",
			"csi.storage.k8s.io/node-publish-secret-name":      "publish",
			"csi.storage.k8s.io/node-publish-secret-namespace": "${pvc.namespace}",
		}
	})
	c := s.claim(t, testutil.NewPVC(s.ns, "data").Class(sc.Name))
	c = s.waitPhase(t, c.Name, corev1.ClaimBound)
	pv, err := s.c.CoreV1().PersistentVolumes().Get(ctx, c.Spec.VolumeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ref := pv.Spec.CSI.NodeStageSecretRef; ref == nil || ref.Name != "stage" {
		t.Errorf("nodeStageSecretRef = %+v", ref)
	}
	if ref := pv.Spec.CSI.NodePublishSecretRef; ref == nil || ref.Name != "publish" {
		t.Errorf("nodePublishSecretRef = %+v", ref)
	}
	pvJSON, err := json.Marshal(pv)
	if err != nil {
		t.Fatal(err)
	}
	s.deleteClaim(t, c.Name)
	s.waitPVGone(t, pv.Name, pv.Spec.CSI.VolumeHandle)
	_ = s.sidecar.Stop(10 * time.Second)
	_ = s.driver.Stop(5 * time.Second)

	// The sidecar really logged at -v=10 while it read the secret: client-go
	// logs each request's URL from -v=6, and bodies from -v=8.
	if n := countLines(t, s.sidecar.LogPath, "/namespaces/"+s.ns+"/secrets/prov"); n == 0 {
		t.Errorf("the sidecar log shows no request for the secret: the search below proves nothing")
	}
	// The driver logged the requests at -v=5, with the secrets replaced.
	if n := countLines(t, s.driver.LogPath, "***stripped***"); n == 0 {
		t.Errorf("the driver log shows no request with stripped secrets: the search below proves nothing")
	}
	for _, path := range []string{s.sidecar.LogPath, s.driver.LogPath} {
		lines, hits := grepSecrets(t, path, prov, stage, publish)
		t.Logf("%s: %d lines searched", path, lines)
		if len(hits) > 0 {
			t.Errorf("%s logs a secret value in %d lines, for example:\n%s", path, len(hits), strings.Join(hits[:min(3, len(hits))], "\n"))
		}
	}
	dumped := dumpedBytes(t, s.sidecar.LogPath)
	if !bytes.Contains(dumped, []byte("PersistentVolumeClaim")) {
		t.Errorf("no claim in the %d bytes of the sidecar log's hex dumps: the search below proves nothing", len(dumped))
	}
	for _, v := range []string{prov, stage, publish} {
		if bytes.Contains(dumped, []byte(v)) {
			t.Errorf("the sidecar log has the secret value %q in the hex dump of a body", v)
		}
	}
	events, err := s.c.CoreV1().Events(s.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	eventsJSON, err := json.Marshal(events)
	if err != nil {
		t.Fatal(err)
	}
	for what, b := range map[string][]byte{"the PV": pvJSON, "the namespace's events": eventsJSON} {
		for _, v := range []string{prov, stage, publish} {
			if bytes.Contains(b, []byte(v)) || bytes.Contains(b, []byte(base64.StdEncoding.EncodeToString([]byte(v)))) {
				t.Errorf("%s carries the secret value %q", what, v)
			}
		}
	}
}

// hexDumpRow matches a row of encoding/hex's Dump: offset, then up to 16
// bytes in hex.
var hexDumpRow = regexp.MustCompile(`(?m)^\s*[0-9a-f]{8}  ((?:[0-9a-f]{2} {1,2}){1,16})`)

// dumpedBytes returns the bytes of every hex dump in the log file, one
// after another: client-go logs a binary (protobuf) body that way from
// -v=8, over several lines in the text format and in one JSON string with
// escaped newlines in the JSON format.
func dumpedBytes(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	text := strings.NewReplacer(`\n`, "\n", `\t`, "\t").Replace(string(b))
	var out []byte
	for _, m := range hexDumpRow.FindAllStringSubmatch(text, -1) {
		for _, h := range strings.Fields(m[1]) {
			v, err := hex.DecodeString(h)
			if err != nil {
				t.Fatalf("hex dump row %q: %v", m[0], err)
			}
			out = append(out, v...)
		}
	}
	return out
}

// grepSecrets returns the number of lines of the file and the lines (cut
// to 300 bytes around the hit) that contain a value, plain or base64.
func grepSecrets(t *testing.T, path string, values ...string) (int, []string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	var needles []string
	for _, v := range values {
		needles = append(needles, v, base64.StdEncoding.EncodeToString([]byte(v)))
	}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	n := 0
	var hits []string
	for sc.Scan() {
		n++
		line := sc.Text()
		for _, needle := range needles {
			if i := strings.Index(line, needle); i >= 0 {
				lo, hi := max(0, i-150), min(len(line), i+150)
				hits = append(hits, fmt.Sprintf("  line %d (%q): ...%s...", n, needle, line[lo:hi]))
				break
			}
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return n, hits
}

// countLines counts the occurrences of sub in the file.
func countLines(t *testing.T, path, sub string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(b), sub)
}
