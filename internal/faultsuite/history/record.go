package history

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cockroachdb/errors"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	idrangev1 "github.com/idrange/idrange/api/idrangev1"
	"github.com/idrange/idrange/snowflake"
)

// Header is the first line of a history: who wrote it and the safety margin
// its client subtracts from every TTL.
type Header struct {
	Name   string        // process name given by the test (no spaces)
	PID    int           // OS process id
	Region int           // region the process mints in
	Margin time.Duration // rangeclient Config.SafetyMargin
	Start  int64         // Now() when the history was created
	Wall   int64         // wall clock (Unix ns) at Start, for humans
}

// DefaultFlushInterval is how often a Recorder writes its buffer to the file
// on its own.
const DefaultFlushInterval = 20 * time.Millisecond

// Recorder appends events to a history file. It is safe for concurrent use.
// Lines are buffered and flushed every DefaultFlushInterval and on Close, so
// a reader tailing the file sees events within a few tens of milliseconds.
//
// A history that misses events proves nothing, so a write error is never
// swallowed: the first one sticks, every later event is dropped, and Err,
// Flush and Close all report it. A process that hands out IDs must check
// Err after recording them and stop minting once it is set (cmd/minter
// exits 1 saying why).
type Recorder struct {
	mu     sync.Mutex
	f      io.WriteCloser
	w      *bufio.Writer
	err    error // first write error; later events are dropped
	closed bool  // Close ran; later events are dropped

	stop chan struct{}
	done chan struct{}
}

// Create creates (truncates) path and writes h as its first line. h.Start
// and h.Wall are filled in when zero.
func Create(path string, h Header) (*Recorder, error) {
	if h.Name == "" || strings.ContainsAny(h.Name, " \t\n=") {
		return nil, errors.Newf("history: header name %q must be non-empty without spaces or '='", h.Name)
	}
	if h.Margin < 0 {
		return nil, errors.Newf("history: header margin %v is negative", h.Margin)
	}
	if h.Start == 0 {
		h.Start = Now()
	}
	if h.Wall == 0 {
		h.Wall = time.Now().UnixNano()
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, errors.Wrap(err, "history: create")
	}
	return newRecorder(f, h)
}

// newRecorder writes h to f, flushes it and starts the flusher. Create's
// seam: the tests give it a writer that fails.
func newRecorder(f io.WriteCloser, h Header) (*Recorder, error) {
	r := &Recorder{f: f, w: bufio.NewWriterSize(f, 64<<10), stop: make(chan struct{}), done: make(chan struct{})}
	r.line("H name=%s pid=%d region=%d margin=%d start=%d wall=%d",
		h.Name, h.PID, h.Region, int64(h.Margin), h.Start, h.Wall)
	go r.flusher()
	if err := r.Flush(); err != nil {
		_ = r.Close()
		return nil, err
	}
	return r, nil
}

func (r *Recorder) flusher() {
	defer close(r.done)
	t := time.NewTicker(DefaultFlushInterval)
	defer t.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-t.C:
			_ = r.Flush()
		}
	}
}

// line formats one event. Only integers and tokens without spaces are
// formatted, so the cost is a few appends.
func (r *Recorder) line(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil || r.closed {
		return
	}
	_, r.err = r.w.WriteString(fmt.Sprintf(format, args...))
	if r.err == nil {
		r.err = r.w.WriteByte('\n')
	}
}

// Acquired records a successful lease acquisition.
func (r *Recorder) Acquired(send, ret, token int64, region, worker int, leaseID int64, ttl time.Duration) {
	r.line("A %d %d %d %d %d %d %d", send, ret, token, region, worker, leaseID, int64(ttl))
}

// Renewed records a successful renewal of the lease with token.
func (r *Recorder) Renewed(send, ret, token int64, ttl time.Duration) {
	r.line("R %d %d %d %d", send, ret, token, int64(ttl))
}

// Released records a successful release.
func (r *Recorder) Released(send, ret, token int64) {
	r.line("L %d %d %d", send, ret, token)
}

// Granted records a block received under the lease with token.
func (r *Recorder) Granted(send, ret, token int64, region, worker int, lo, hi, serviceNs, validNs int64) {
	r.line("B %d %d %d %d %d %d %d %d %d", send, ret, token, region, worker, lo, hi, serviceNs, validNs)
}

// SharedGranted records a shared run received (AllocateShared): positions
// [lo, hi) of a replica's code, held by no lease of this process.
func (r *Recorder) SharedGranted(send, ret int64, region, worker int, lo, hi, serviceNs, validNs int64) {
	r.line("S %d %d %d %d %d %d %d %d", send, ret, region, worker, lo, hi, serviceNs, validNs)
}

// CallFailed records a failed call (method: acquire, renew, release,
// allocate, shared) with a one-word reason (the gRPC code).
func (r *Recorder) CallFailed(send, ret int64, method string, token int64, reason string) {
	r.line("X %d %d %s %d %s", send, ret, word(method), token, word(reason))
}

// Minted records IDs handed out by one call that started at t0 and returned
// at t1, in the order handed out.
func (r *Recorder) Minted(t0, t1 int64, ids []snowflake.ID) {
	if len(ids) == 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil || r.closed {
		return
	}
	b := make([]byte, 0, 48+21*len(ids))
	b = append(b, 'I', ' ')
	b = strconv.AppendInt(b, t0, 10)
	b = append(b, ' ')
	b = strconv.AppendInt(b, t1, 10)
	for _, id := range ids {
		b = append(b, ' ')
		b = strconv.AppendInt(b, int64(id), 10)
	}
	b = append(b, '\n')
	_, r.err = r.w.Write(b)
}

// MintFailed records a minting call that failed, with a one-word class.
func (r *Recorder) MintFailed(t0, t1 int64, class string) {
	r.line("E %d %d %s", t0, t1, word(class))
}

// Note records a free-text note (a fault applied inside the process).
func (r *Recorder) Note(t int64, text string) {
	r.line("N %d %s", t, strings.ReplaceAll(text, "\n", " "))
}

// Err is the first error writing the history (nil while every event so
// far reached the buffer or the file). Once it is set the history misses
// events: stop handing out IDs.
func (r *Recorder) Err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil {
		return errors.Wrap(r.err, "history: write")
	}
	return nil
}

// Flush writes buffered events to the file. It returns the first write
// error, this flush's or an earlier one's.
func (r *Recorder) Flush() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil {
		return errors.Wrap(r.err, "history: write")
	}
	if r.closed {
		return nil
	}
	if err := r.w.Flush(); err != nil {
		r.err = err
		return errors.Wrap(err, "history: flush")
	}
	return nil
}

// Close flushes and closes the file and returns the first write error, if
// any. Later events are dropped; a second Close returns nil.
func (r *Recorder) Close() error {
	select {
	case <-r.stop:
		return nil
	default:
	}
	close(r.stop)
	<-r.done
	err := r.Flush()
	r.mu.Lock()
	r.closed = true
	cerr := r.f.Close()
	r.mu.Unlock()
	if err != nil {
		return err
	}
	return errors.Wrap(cerr, "history: close")
}

// UnaryClientInterceptor records every lease, block and shared-run call of
// the RangeService made through the connection it is installed on (pass it to
// the client in rangeclient.Config.DialOptions with
// grpc.WithChainUnaryInterceptor). Send is read before the call is handed
// to gRPC, ret after the reply is decoded, so they bracket what the client
// library itself measures.
func (r *Recorder) UnaryClientInterceptor() grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		send := Now()
		err := invoker(ctx, method, req, reply, cc, opts...)
		ret := Now()
		r.recordCall(send, ret, req, reply, err)
		return err
	}
}

func (r *Recorder) recordCall(send, ret int64, req, reply any, err error) {
	reason := ""
	if err != nil {
		reason = status.Code(err).String()
	}
	switch q := req.(type) {
	case *idrangev1.AcquireLeaseRequest:
		p, _ := reply.(*idrangev1.AcquireLeaseResponse)
		if err != nil || p == nil || p.GetLease() == nil {
			r.CallFailed(send, ret, "acquire", 0, orReason(reason, "no-lease"))
			return
		}
		l := p.GetLease()
		r.Acquired(send, ret, l.GetToken(), int(l.GetRegion()), int(l.GetWorker()), l.GetLeaseId(),
			time.Duration(p.GetTtlMs())*time.Millisecond)
	case *idrangev1.RenewLeaseRequest:
		p, _ := reply.(*idrangev1.RenewLeaseResponse)
		if err != nil || p == nil {
			r.CallFailed(send, ret, "renew", q.GetLease().GetToken(), orReason(reason, "no-reply"))
			return
		}
		r.Renewed(send, ret, q.GetLease().GetToken(), time.Duration(p.GetTtlMs())*time.Millisecond)
	case *idrangev1.ReleaseLeaseRequest:
		if err != nil {
			r.CallFailed(send, ret, "release", q.GetLease().GetToken(), reason)
			return
		}
		r.Released(send, ret, q.GetLease().GetToken())
	case *idrangev1.AllocateBlockRequest:
		p, _ := reply.(*idrangev1.AllocateBlockResponse)
		if err != nil || p == nil {
			r.CallFailed(send, ret, "allocate", q.GetLease().GetToken(), orReason(reason, "no-reply"))
			return
		}
		l := q.GetLease()
		r.Granted(send, ret, l.GetToken(), int(l.GetRegion()), int(l.GetWorker()), p.GetLo(), p.GetHi(),
			p.GetServiceTimeUnixNano(), p.GetValidUntilUnixNano())
	case *idrangev1.AllocateSharedRequest:
		p, _ := reply.(*idrangev1.AllocateSharedResponse)
		if err != nil || p == nil {
			r.CallFailed(send, ret, "shared", 0, orReason(reason, "no-reply"))
			return
		}
		r.SharedGranted(send, ret, int(p.GetRegion()), int(p.GetWorker()), p.GetLo(), p.GetHi(),
			p.GetServiceTimeUnixNano(), p.GetValidUntilUnixNano())
	}
}

func orReason(reason, def string) string {
	if reason == "" {
		return def
	}
	return reason
}

// word makes s a single non-empty token for a space-separated line.
func word(s string) string {
	if s == "" {
		return "-"
	}
	return strings.Map(func(c rune) rune {
		if c == ' ' || c == '\t' || c == '\n' || c == '\r' {
			return '_'
		}
		return c
	}, s)
}
