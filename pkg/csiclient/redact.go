package csiclient

import (
	"bytes"
	"cmp"
	"context"
	"encoding/base64"
	"errors"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/go-logr/logr"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/types/known/wrapperspb"
	"k8s.io/klog/v2"
)

// stripped replaces a secret value, as protosanitizer does.
const stripped = "***stripped***"

// redactor replaces the values of a call's secrets in text a driver wrote:
// a driver that formats the request into its error message (with %v, say)
// would otherwise put them into the sidecar's events and logs, where
// protosanitizer, which only sees the request, cannot help.
type redactor struct{ values []string }

// newRedactor returns the redactor of secrets; nil when there are none to
// replace. Besides each value as it is, it replaces the value as quoted
// strings show it: a request formatted with %v (its protobuf text format)
// escapes a quote, a backslash, a newline or an invalid byte, as %q and
// JSON escape the first three. A value of at least minEncodedLen bytes is
// also replaced in the encodings a driver may echo it in: base64 (standard
// and URL alphabets, padded or not, as a driver that logs credentials as
// it sends them in an HTTP Basic header or a JSON []byte) and URL escaping
// (query and path, as in a URL with the credentials in it).
func newRedactor(secrets map[string]string) *redactor {
	var values []string
	for _, v := range secrets {
		if v == "" {
			continue
		}
		q := strconv.Quote(v)
		values = append(values, v, textQuoted(v), q[1:len(q)-1])
		if len(v) >= minEncodedLen {
			values = append(values, encodedForms(v)...)
		}
	}
	if len(values) == 0 {
		return nil
	}
	slices.Sort(values)
	return &redactor{values: slices.Compact(values)}
}

// minEncodedLen is the shortest secret whose encoded forms are replaced
// too. The encodings of shorter ones are two to four characters, which
// would strip as many characters from the driver's own words as often as
// they occur (the value itself is replaced at any length).
const minEncodedLen = 4

// encodedForms returns v in base64, with either alphabet and with or
// without padding, and URL-escaped for a query or a path. Forms equal to v
// are left out.
func encodedForms(v string) []string {
	b := []byte(v)
	var out []string
	for _, f := range []string{
		base64.StdEncoding.EncodeToString(b), base64.RawStdEncoding.EncodeToString(b),
		base64.URLEncoding.EncodeToString(b), base64.RawURLEncoding.EncodeToString(b),
		url.QueryEscape(v), url.PathEscape(v),
	} {
		if f != v {
			out = append(out, f)
		}
	}
	return out
}

// textQuoted returns v as the protobuf text format writes it between its
// quotes; v when it cannot be written.
func textQuoted(v string) string {
	b, err := prototext.Marshal(wrapperspb.String(v))
	if err != nil {
		return v
	}
	i, j := bytes.IndexByte(b, '"'), bytes.LastIndexByte(b, '"')
	if i < 0 || j <= i {
		return v
	}
	return string(b[i+1 : j])
}

// replace returns s with every byte that lies in an occurrence of a secret
// value replaced: each run of such bytes becomes one marker. Occurrences
// that overlap (secrets "ab" and "bcd" in "abcd", or "aa" twice in "aaa")
// are stripped together, so no part of either survives; a single-pass
// replacement would keep what follows the first match.
func (r *redactor) replace(s string) string {
	type span struct{ start, end int }
	var spans []span
	for _, v := range r.values {
		for from := 0; from < len(s); {
			i := strings.Index(s[from:], v)
			if i < 0 {
				break
			}
			spans = append(spans, span{from + i, from + i + len(v)})
			from += i + 1
		}
	}
	if len(spans) == 0 {
		return s
	}
	slices.SortFunc(spans, func(a, b span) int { return cmp.Compare(a.start, b.start) })
	var b strings.Builder
	kept := 0 // s[:kept] is written
	for i := 0; i < len(spans); {
		start, end := spans[i].start, spans[i].end
		for i++; i < len(spans) && spans[i].start <= end; i++ {
			end = max(end, spans[i].end)
		}
		b.WriteString(s[kept:start])
		b.WriteString(stripped)
		kept = end
	}
	b.WriteString(s[kept:])
	return b.String()
}

// context returns ctx with its logger wrapped so that what csi-lib-utils
// logs of the call at V(5) (the driver's error among it) is redacted too.
func (r *redactor) context(ctx context.Context) context.Context {
	if r == nil {
		return ctx
	}
	logger := klog.FromContext(ctx)
	if logger.GetSink() == nil {
		return ctx
	}
	sink := logger.GetSink()
	// One call deeper: the sink's Info is called from redactingSink's, and
	// the file:line it reports must stay the caller's.
	if d, ok := sink.(logr.CallDepthLogSink); ok {
		sink = d.WithCallDepth(1)
	}
	return klog.NewContext(ctx, logger.WithSink(redactingSink{LogSink: sink, r: r}))
}

// error returns err with the secrets stripped from its gRPC status message,
// keeping the code and details; err itself when there is nothing to strip.
// An error without a gRPC status comes from gRPC or the context, never from
// the driver, and is returned as it is.
func (r *redactor) error(err error) error {
	if r == nil || err == nil {
		return err
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	msg := r.replace(st.Message())
	if msg == st.Message() {
		return err
	}
	p := st.Proto()
	p.Message = msg
	return status.ErrorProto(p)
}

// value redacts a logged value: errors and strings.
func (r *redactor) value(v any) any {
	switch v := v.(type) {
	case error:
		if s := r.replace(v.Error()); s != v.Error() {
			return errors.New(s)
		}
	case string:
		return r.replace(v)
	}
	return v
}

// redactingSink redacts the message and the error and string values of
// everything logged through it.
type redactingSink struct {
	logr.LogSink
	r *redactor
}

var (
	_ logr.CallDepthLogSink       = redactingSink{}
	_ logr.CallStackHelperLogSink = redactingSink{}
)

func (s redactingSink) redact(kv []any) []any {
	out := make([]any, len(kv))
	for i, v := range kv {
		out[i] = s.r.value(v)
	}
	return out
}

func (s redactingSink) Info(level int, msg string, kv ...any) {
	s.LogSink.Info(level, s.r.replace(msg), s.redact(kv)...)
}

func (s redactingSink) Error(err error, msg string, kv ...any) {
	if err != nil {
		err, _ = s.r.value(err).(error)
	}
	s.LogSink.Error(err, s.r.replace(msg), s.redact(kv)...)
}

func (s redactingSink) WithValues(kv ...any) logr.LogSink {
	return redactingSink{LogSink: s.LogSink.WithValues(s.redact(kv)...), r: s.r}
}

func (s redactingSink) WithName(name string) logr.LogSink {
	return redactingSink{LogSink: s.LogSink.WithName(name), r: s.r}
}

// WithCallDepth keeps the call sites csi-lib-utils reports (file:line).
func (s redactingSink) WithCallDepth(depth int) logr.LogSink {
	if d, ok := s.LogSink.(logr.CallDepthLogSink); ok {
		return redactingSink{LogSink: d.WithCallDepth(depth), r: s.r}
	}
	return s
}

func (s redactingSink) GetCallStackHelper() func() {
	if h, ok := s.LogSink.(logr.CallStackHelperLogSink); ok {
		return h.GetCallStackHelper()
	}
	return func() {}
}
