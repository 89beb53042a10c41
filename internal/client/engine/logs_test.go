package engine

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idrange/idrange/rangeclient/rangeclienttest"
)

// recordHandler keeps every log record (level Debug and up).
type recordHandler struct {
	mu   *sync.Mutex
	recs *[]slog.Record
}

func (h recordHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h recordHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	*h.recs = append(*h.recs, r.Clone())
	return nil
}
func (h recordHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h recordHandler) WithGroup(string) slog.Handler      { return h }

// Through an outage that costs the lease and a recovery, every log line is
// one line: no value spans lines or carries a stack trace, and the line
// saying minting stopped names the cause.
func TestLogLinesAreOneLineWithCause(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var (
			mu   sync.Mutex
			recs []slog.Record
		)
		svc := fakeService(3 * time.Second)
		conn := svc.Conn()
		c := newTestClient(t, conn, func(cfg *Config) {
			shortLease(cfg)
			cfg.Logger = slog.New(recordHandler{&mu, &recs})
		})
		mustNext(t, c)
		conn.SetFault(rangeclienttest.Unreachable)
		time.Sleep(c.Lease().SafeFor + time.Second)
		conn.SetFault(rangeclienttest.Healthy)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := c.Next(ctx); err != nil {
			t.Fatalf("no recovery: %v", err)
		}

		mu.Lock()
		defer mu.Unlock()
		var stopped bool
		for _, r := range recs {
			r.Attrs(func(a slog.Attr) bool {
				v := a.Value.String()
				if strings.Contains(v, "\n") || strings.Contains(v, "goroutine ") || strings.Contains(v, ".go:") {
					t.Errorf("%s: attribute %s spans lines or carries a stack: %q", r.Message, a.Key, v)
				}
				if strings.Contains(r.Message, "minting stopped") && a.Key == "cause" {
					stopped = a.Value.Any() != nil && v != "" && v != "<nil>"
				}
				return true
			})
		}
		if !stopped {
			t.Fatalf("no 'minting stopped' line with a cause among %d records", len(recs))
		}
	})
}
