package csiclient

import (
	"encoding/base64"
	"errors"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// FuzzRedact strips two secret values from a driver's error message.
// Invariants: the code is kept; every byte of the message that lies in an
// occurrence of a non-empty secret is gone, overlapping occurrences
// included (a secret's quoted forms count as occurrences, and so do its
// base64 and URL-escaped forms when it has four bytes or more), and each run of
// such bytes is one marker, the rest of the message kept as it is (checked against a byte mask built here); a
// message without a secret comes back as the very same error. Text that
// only resembles part of a secret ("passwor" for "password") is not an
// occurrence and stays: no length N below a secret's own can be promised
// for text the driver wrote by itself.
func FuzzRedact(f *testing.F) {
	f.Add("password", "pass", "create failed: secrets map[password:password user:pass]")
	f.Add("abc", "bcd", "abcd")
	f.Add("", "x", "no secret here")
	f.Add("*", "s", stripped)
	f.Add("ab", "bcdefgh", "abcdefgh")
	f.Add("aa", "", "aaa")
	f.Add("ab", "cd", "xabcdx")
	f.Add("a\"b", "c\\d", `value:"a\"b" value:"c\\d" map[a:a"b]`)
	f.Add("abcd", "bc", "xabcdx")                                 // one occurrence inside another
	f.Add("pass", "", "auth cGFzcw== refused")                    // the shortest secret whose base64 goes too
	f.Add("???>", "", "auth Pz8_Pg refused")                      // base64, URL alphabet, unpadded only
	f.Add("q\"r\u00a0s", "", `"q\"r\u00a0s" "q\"r`+"\u00a0"+`s"`) // Go-quoted and text-format forms
	f.Fuzz(func(t *testing.T, s1, s2, msg string) {
		r := newRedactor(map[string]string{"a": s1, "b": s2})
		in := status.Error(codes.InvalidArgument, msg)
		out := r.error(in)
		st, ok := status.FromError(out)
		if !ok || st.Code() != codes.InvalidArgument {
			t.Fatalf("redacted error %v lost its code", out)
		}
		if r == nil {
			if !errors.Is(out, in) {
				t.Fatal("no secrets: the error must be returned as it is")
			}
			return
		}
		var forms []string
		for _, v := range []string{s1, s2} {
			if v != "" {
				q := strconv.Quote(v)
				forms = append(forms, v, q[1:len(q)-1], textQuoted(v))
				if len(v) >= 4 {
					b := []byte(v)
					forms = append(forms, base64.StdEncoding.EncodeToString(b), base64.RawStdEncoding.EncodeToString(b),
						base64.URLEncoding.EncodeToString(b), base64.RawURLEncoding.EncodeToString(b), url.QueryEscape(v), url.PathEscape(v))
				}
			}
		}
		if want := maskSecrets(msg, forms...); st.Message() != want {
			t.Errorf("secrets %q, %q in %q: got %q, want %q", s1, s2, msg, st.Message(), want)
		}
		if !slices.ContainsFunc(forms, func(v string) bool { return strings.Contains(msg, v) }) && !errors.Is(out, in) {
			t.Errorf("message without secrets changed: %q", st.Message())
		}
	})
}

// maskSecrets is the reference: it marks every byte covered by an
// occurrence of a secret, trying each secret at each offset, and writes a
// marker for each run of marked bytes.
func maskSecrets(msg string, secrets ...string) string {
	covered := make([]bool, len(msg))
	for i := range len(msg) { // bytes, not runes
		for _, s := range secrets {
			if s != "" && strings.HasPrefix(msg[i:], s) {
				for j := range len(s) {
					covered[i+j] = true
				}
			}
		}
	}
	var b strings.Builder
	for i := range len(msg) { // bytes, not runes
		switch {
		case !covered[i]:
			b.WriteByte(msg[i])
		case i == 0 || !covered[i-1]:
			b.WriteString(stripped)
		}
	}
	return b.String()
}

// TestRedactShortSecret pins what doc.go says of short secrets: every
// occurrence goes, in the driver's own words too.
func TestRedactShortSecret(t *testing.T) {
	r := newRedactor(map[string]string{"pin": "1"})
	got := r.replace("volume 1 of 10 failed")
	if want := "volume " + stripped + " of " + stripped + "0 failed"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	// Its base64 ("MQ") is not a form of it: too short to tell from words.
	if got := r.replace("MQTT broker down"); got != "MQTT broker down" {
		t.Errorf("got %q, want the message unchanged", got)
	}
}

// TestRedactEncodedSecret: a driver that echoes a secret base64-encoded (as
// in an HTTP Basic header or a JSON []byte) or URL-escaped (a URL with the
// credentials in it) does not show it either.
func TestRedactEncodedSecret(t *testing.T) {
	const secret = "p@ss w/rd+?" // differs in every encoding
	r := newRedactor(map[string]string{"password": secret})
	for _, tc := range []struct{ name, msg string }{
		{"base64", "auth " + base64.StdEncoding.EncodeToString([]byte(secret)) + " refused"},
		{"base64 without padding", "auth " + base64.RawStdEncoding.EncodeToString([]byte(secret)) + " refused"},
		{"base64 URL alphabet", "auth " + base64.URLEncoding.EncodeToString([]byte(secret)) + " refused"},
		{"query escaped", "GET https://array/api?user=admin&password=" + url.QueryEscape(secret) + " refused"},
		{"path escaped", "GET https://admin:" + url.PathEscape(secret) + "@array/api refused"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := r.replace(tc.msg)
			if !strings.Contains(got, stripped) || strings.Contains(tc.msg, secret) {
				t.Errorf("replace(%q) = %q: want the encoded secret stripped", tc.msg, got)
			}
			if !strings.HasSuffix(got, " refused") {
				t.Errorf("replace(%q) = %q: want the driver's words kept", tc.msg, got)
			}
		})
	}
}
