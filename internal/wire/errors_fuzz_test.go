package wire

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"
)

// FuzzErrorMapping: whatever status a server sends (idrange's or another's:
// any code, message, ErrorInfo and RetryInfo), FromStatus returns one line
// that keeps the code and wraps at most one sentinel, idrange's own reason's
// when the ErrorInfo is idrange's; and whatever the message of an error
// that wraps a sentinel, ToStatus and FromStatus carry that sentinel, its
// code and the message across.
func FuzzErrorMapping(f *testing.F) {
	f.Add(uint32(codes.FailedPrecondition), "worker 7: fenced", "FENCED", ErrorDomain, int64(-1), uint8(0))
	f.Add(uint32(codes.ResourceExhausted), "slow down", "BACKPRESSURE", ErrorDomain, int64(250*time.Millisecond), uint8(4))
	f.Add(uint32(codes.ResourceExhausted), "", "", "", int64(0), uint8(4))
	f.Add(uint32(codes.Unavailable), "proxy: upstream failed\ngoroutine 1 [running]:", "", "", int64(-1), uint8(9))
	f.Add(uint32(codes.FailedPrecondition), "other server", "FENCED", "other.example", int64(-1), uint8(1))
	f.Add(uint32(codes.OK), "", "", "", int64(-1), uint8(16))
	f.Add(uint32(99), "\r\n\xff", "NO_SUCH_REASON", ErrorDomain, int64(-5), uint8(200))
	f.Fuzz(func(t *testing.T, code uint32, msg, reason, domain string, retryNanos int64, pick uint8) {
		c := codes.Code(code % 20) // the 17 codes and a few no client knows
		withDetails := func(details ...protoadapt.MessageV1) *status.Status {
			st := status.New(c, msg)
			if len(details) == 0 || c == codes.OK { // OK carries no details
				return st
			}
			with, err := st.WithDetails(details...)
			if err != nil {
				t.Fatalf("WithDetails: %v", err)
			}
			return with
		}
		var retry []protoadapt.MessageV1
		if retryNanos >= 0 {
			retry = append(retry, &errdetails.RetryInfo{RetryDelay: durationpb.New(time.Duration(retryNanos))})
		}
		info := retry
		// An ErrorInfo whose strings are not UTF-8 does not marshal, so no
		// server can send it.
		if (reason != "" || domain != "") && utf8.ValidString(reason) && utf8.ValidString(domain) {
			info = append([]protoadapt.MessageV1{&errdetails.ErrorInfo{Reason: reason, Domain: domain}}, retry...)
		}
		got := FromStatus(withDetails(info...).Err())
		// The same status without the ErrorInfo: mapped by code alone.
		byCodeAlone := FromStatus(withDetails(retry...).Err())
		if c == codes.OK {
			if got != nil {
				t.Fatalf("FromStatus of OK = %v, want nil", got)
			}
		} else {
			if status.Code(got) != c {
				t.Fatalf("FromStatus: code %v, want %v", status.Code(got), c)
			}
			if strings.ContainsAny(got.Error(), "\r\n") {
				t.Fatalf("FromStatus: message %q spans lines", got.Error())
			}
			var wrapped []error
			for _, m := range mappings {
				if errors.Is(got, m.sentinel) {
					wrapped = append(wrapped, m.sentinel)
				}
			}
			if len(wrapped) > 1 {
				t.Fatalf("FromStatus(%v %q) wraps %v: more than one sentinel", c, msg, wrapped)
			}
			ours := false
			for _, m := range mappings {
				if domain == ErrorDomain && reason == m.reason {
					ours = true
					if !errors.Is(got, m.sentinel) {
						t.Fatalf("FromStatus: reason %s does not give %v (got %v)", reason, m.sentinel, wrapped)
					}
				}
			}
			// Any other ErrorInfo (another domain, an unknown reason)
			// changes nothing: the code decides.
			for _, m := range mappings {
				if !ours && errors.Is(got, m.sentinel) != errors.Is(byCodeAlone, m.sentinel) {
					t.Fatalf("FromStatus(%v, reason %q domain %q) = %v; without the ErrorInfo %v", c, reason, domain, got, byCodeAlone)
				}
			}
		}

		m := mappings[int(pick)%len(mappings)]
		orig := fmt.Errorf("%s: %w", msg, m.sentinel)
		sent := ToStatus(orig)
		back := FromStatus(sent)
		if status.Code(sent) != m.code || status.Code(back) != m.code || !errors.Is(back, m.sentinel) {
			t.Fatalf("%v with message %q: sent %v, received %v (code %v)", m.sentinel, msg, status.Code(sent), back, status.Code(back))
		}
		switch {
		case strings.ContainsAny(back.Error(), "\r\n"):
			t.Fatalf("message %q came back on more than one line: %q", orig.Error(), back.Error())
		case !strings.ContainsAny(orig.Error(), "\r\n") && back.Error() != orig.Error():
			t.Fatalf("message %q came back as %q", orig.Error(), back.Error())
		}
	})
}
