package history

import (
	"bytes"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/cockroachdb/errors"

	"github.com/idrange/idrange/snowflake"
)

// ErrMalformed: a history line does not parse. Parsing stops there: a
// history that cannot be read proves nothing.
var ErrMalformed = errors.New("history: malformed line")

// Lease is an acquisition (A line).
type Lease struct {
	Send, Ret      int64
	Token          int64
	Region, Worker int
	LeaseID        int64
	TTL            time.Duration
}

// Renewal is a successful renewal (R line).
type Renewal struct {
	Send, Ret int64
	Token     int64
	TTL       time.Duration
}

// Release is a successful release (L line).
type Release struct {
	Send, Ret int64
	Token     int64
}

// Block is a block received (B line). ServiceTime and ValidUntil are Unix
// ns on the service's clock.
type Block struct {
	Send, Ret               int64
	Token                   int64
	Region, Worker          int
	Lo, Hi                  int64
	ServiceTime, ValidUntil int64
}

// Len is the number of positions in the block.
func (b Block) Len() int64 { return b.Hi - b.Lo }

// SharedRun is a shared run received (S line): positions [Lo, Hi) of a
// code a replica's own minter holds, granted by AllocateShared to a process
// without a lease of that code. ServiceTime and ValidUntil are Unix ns on
// the service's clock.
type SharedRun struct {
	Send, Ret               int64
	Region, Worker          int
	Lo, Hi                  int64
	ServiceTime, ValidUntil int64
}

// Len is the number of positions in the run.
func (s SharedRun) Len() int64 { return s.Hi - s.Lo }

// FailedCall is a failed RangeService call (X line).
type FailedCall struct {
	Send, Ret int64
	Method    string
	Token     int64
	Reason    string
}

// Mint is one successful minting call (I line): the IDs it handed out, in
// order.
type Mint struct {
	T0, T1 int64
	IDs    []int64
}

// MintFailure is a failed minting call (E line).
type MintFailure struct {
	T0, T1 int64
	Class  string
}

// Note is a free-text event (N line).
type Note struct {
	T    int64
	Text string
}

// History is one process's parsed history.
type History struct {
	Path string
	Header
	Leases   []Lease
	Renewals []Renewal
	Releases []Release
	Blocks   []Block
	Shared   []SharedRun
	Failed   []FailedCall
	Mints    []Mint
	Failures []MintFailure
	Notes    []Note

	ids     int64
	lines   int
	partial []byte // an incomplete last line (live tailing)
}

// IDs is the number of IDs handed out.
func (h *History) IDs() int64 { return h.ids }

// LastMint returns the last successful minting call (ok false if none).
func (h *History) LastMint() (Mint, bool) {
	if len(h.Mints) == 0 {
		return Mint{}, false
	}
	return h.Mints[len(h.Mints)-1], true
}

// FirstMintAfter returns the first minting call that started at or after t.
func (h *History) FirstMintAfter(t int64) (Mint, bool) {
	i := sort.Search(len(h.Mints), func(i int) bool { return h.Mints[i].T0 >= t })
	if i == len(h.Mints) {
		return Mint{}, false
	}
	return h.Mints[i], true
}

// LastMintBefore returns the last minting call that returned before t.
func (h *History) LastMintBefore(t int64) (Mint, bool) {
	i := sort.Search(len(h.Mints), func(i int) bool { return h.Mints[i].T1 >= t })
	if i == 0 {
		return Mint{}, false
	}
	return h.Mints[i-1], true
}

// FirstFailureAfter returns the first failed minting call that started at
// or after t.
func (h *History) FirstFailureAfter(t int64) (MintFailure, bool) {
	i := sort.Search(len(h.Failures), func(i int) bool { return h.Failures[i].T0 >= t })
	if i == len(h.Failures) {
		return MintFailure{}, false
	}
	return h.Failures[i], true
}

// MintedBetween counts IDs of calls that started in [a, b).
func (h *History) MintedBetween(a, b int64) int64 {
	var n int64
	for _, m := range h.Mints {
		if m.T0 >= a && m.T0 < b {
			n += int64(len(m.IDs))
		}
	}
	return n
}

// MintedWithin counts IDs of calls that started at or after a and returned
// before b.
func (h *History) MintedWithin(a, b int64) int64 {
	var n int64
	for _, m := range h.Mints {
		if m.T0 >= a && m.T1 < b {
			n += int64(len(m.IDs))
		}
	}
	return n
}

// ReadFile parses a complete history file. A last line without its newline
// (the writer died mid-line) is an error: check only histories of processes
// that exited.
func ReadFile(path string) (*History, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, errors.Wrap(err, "history: read")
	}
	return parseComplete(b, path)
}

// Parse parses a complete history from r (see ReadFile); name labels errors.
func Parse(r io.Reader, name string) (*History, error) {
	b, err := io.ReadAll(r)
	if err != nil {
		return nil, errors.Wrap(err, "history: read")
	}
	return parseComplete(b, name)
}

// parseComplete parses b as a whole history labelled name: a last line
// without its newline, or no header at all, is ErrMalformed.
func parseComplete(b []byte, name string) (*History, error) {
	h := &History{Path: name}
	if err := h.feed(b); err != nil {
		return nil, err
	}
	if len(h.partial) > 0 {
		return nil, errors.Wrapf(ErrMalformed, "%s: last line %d is incomplete: %q", name, h.lines+1, clip(h.partial))
	}
	if h.lines == 0 {
		return nil, errors.Wrapf(ErrMalformed, "%s: empty history (no header)", name)
	}
	return h, nil
}

// Tail follows a history file that is still being written: each Poll parses
// the complete lines appended since the last one.
type Tail struct {
	path string
	off  int64
	h    *History
}

// NewTail follows path (which may not exist yet).
func NewTail(path string) *Tail { return &Tail{path: path, h: &History{Path: path}} }

// Poll reads what was appended and returns the history so far (shared with
// later Polls; do not modify it).
func (t *Tail) Poll() (*History, error) {
	f, err := os.Open(t.path)
	if errors.Is(err, os.ErrNotExist) {
		return t.h, nil
	}
	if err != nil {
		return t.h, errors.Wrap(err, "history: tail")
	}
	defer f.Close()
	if _, err := f.Seek(t.off, io.SeekStart); err != nil {
		return t.h, errors.Wrap(err, "history: tail")
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return t.h, errors.Wrap(err, "history: tail")
	}
	t.off += int64(len(b))
	return t.h, t.h.feed(b)
}

// feed parses complete lines of b (after any partial line left before).
func (h *History) feed(b []byte) error {
	if len(h.partial) > 0 {
		b = append(h.partial, b...)
		h.partial = nil
	}
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			h.partial = append([]byte(nil), b...)
			return nil
		}
		if err := h.parseLine(string(b[:i])); err != nil {
			return errors.Wrapf(err, "%s:%d", h.Path, h.lines+1)
		}
		h.lines++
		b = b[i+1:]
	}
	return nil
}

func (h *History) parseLine(line string) error {
	if line == "" {
		return errors.Wrap(ErrMalformed, "empty line")
	}
	if h.lines == 0 {
		if !strings.HasPrefix(line, "H ") {
			return errors.Wrapf(ErrMalformed, "first line must be the H header, got %q", clip([]byte(line)))
		}
		return h.parseHeader(line[2:])
	}
	if len(line) < 2 || line[1] != ' ' {
		return errors.Wrapf(ErrMalformed, "%q: want '<tag> <fields>'", clip([]byte(line)))
	}
	tag, rest := line[0], line[2:]
	if tag == 'N' { // free text after the time
		t, text, _ := strings.Cut(rest, " ")
		v, err := parseInt(t)
		if err != nil {
			return err
		}
		h.Notes = append(h.Notes, Note{T: v, Text: text})
		return nil
	}
	f := strings.Fields(rest)
	want := map[byte]int{'A': 7, 'R': 4, 'L': 3, 'B': 9, 'S': 8, 'X': 5, 'E': 3}
	if n, ok := want[tag]; ok && len(f) != n {
		return errors.Wrapf(ErrMalformed, "%c line has %d fields, want %d", tag, len(f), n)
	}
	switch tag {
	case 'A':
		v, err := ints(f[:3], f[5:]...)
		if err != nil {
			return err
		}
		region, worker, err := code(f[3], f[4])
		if err != nil {
			return err
		}
		if v[4] <= 0 {
			return errors.Wrapf(ErrMalformed, "A line: ttl %d", v[4])
		}
		h.Leases = append(h.Leases, Lease{Send: v[0], Ret: v[1], Token: v[2], Region: region, Worker: worker,
			LeaseID: v[3], TTL: time.Duration(v[4])})
	case 'R':
		v, err := ints(f)
		if err != nil {
			return err
		}
		h.Renewals = append(h.Renewals, Renewal{Send: v[0], Ret: v[1], Token: v[2], TTL: time.Duration(v[3])})
	case 'L':
		v, err := ints(f)
		if err != nil {
			return err
		}
		h.Releases = append(h.Releases, Release{Send: v[0], Ret: v[1], Token: v[2]})
	case 'B':
		v, err := ints(f[:3], f[5:]...)
		if err != nil {
			return err
		}
		region, worker, err := code(f[3], f[4])
		if err != nil {
			return err
		}
		if v[4] <= v[3] || v[3] < 0 {
			return errors.Wrapf(ErrMalformed, "B line: block [%d,%d) is empty or negative", v[3], v[4])
		}
		h.Blocks = append(h.Blocks, Block{Send: v[0], Ret: v[1], Token: v[2], Region: region, Worker: worker,
			Lo: v[3], Hi: v[4], ServiceTime: v[5], ValidUntil: v[6]})
	case 'S':
		v, err := ints(f[:2], f[4:]...)
		if err != nil {
			return err
		}
		region, worker, err := code(f[2], f[3])
		if err != nil {
			return err
		}
		if v[3] <= v[2] || v[2] < 0 {
			return errors.Wrapf(ErrMalformed, "S line: run [%d,%d) is empty or negative", v[2], v[3])
		}
		h.Shared = append(h.Shared, SharedRun{Send: v[0], Ret: v[1], Region: region, Worker: worker,
			Lo: v[2], Hi: v[3], ServiceTime: v[4], ValidUntil: v[5]})
	case 'X':
		v, err := ints([]string{f[0], f[1], f[3]})
		if err != nil {
			return err
		}
		h.Failed = append(h.Failed, FailedCall{Send: v[0], Ret: v[1], Method: f[2], Token: v[2], Reason: f[4]})
	case 'I':
		if len(f) < 3 {
			return errors.Wrapf(ErrMalformed, "I line has %d fields, want times and at least one id", len(f))
		}
		v, err := ints(f)
		if err != nil {
			return err
		}
		h.Mints = append(h.Mints, Mint{T0: v[0], T1: v[1], IDs: v[2:]})
		h.ids += int64(len(v) - 2)
	case 'E':
		v, err := ints(f[:2])
		if err != nil {
			return err
		}
		h.Failures = append(h.Failures, MintFailure{T0: v[0], T1: v[1], Class: f[2]})
	default:
		return errors.Wrapf(ErrMalformed, "unknown tag %q", tag)
	}
	return nil
}

func (h *History) parseHeader(s string) error {
	seen := map[string]bool{}
	for _, kv := range strings.Fields(s) {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || seen[k] {
			return errors.Wrapf(ErrMalformed, "header field %q", kv)
		}
		seen[k] = true
		if k == "name" {
			if v == "" {
				return errors.Wrap(ErrMalformed, "header: empty name")
			}
			h.Name = v
			continue
		}
		n, err := parseInt(v)
		if err != nil {
			return errors.Wrapf(err, "header field %s", k)
		}
		switch k {
		case "pid":
			h.PID = int(n)
		case "region":
			if n < 0 || n > snowflake.MaxRegion {
				return errors.Wrapf(ErrMalformed, "header: region %d", n)
			}
			h.Region = int(n)
		case "margin":
			if n < 0 {
				return errors.Wrapf(ErrMalformed, "header: margin %d", n)
			}
			h.Margin = time.Duration(n)
		case "start":
			h.Start = n
		case "wall":
			h.Wall = n
		default:
			return errors.Wrapf(ErrMalformed, "header: unknown field %q", k)
		}
	}
	for _, k := range []string{"name", "pid", "region", "margin", "start"} {
		if !seen[k] {
			return errors.Wrapf(ErrMalformed, "header: missing %s", k)
		}
	}
	return nil
}

func parseInt(s string) (int64, error) {
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, errors.Wrapf(ErrMalformed, "%q is not an integer", clip([]byte(s)))
	}
	return v, nil
}

// ints parses every field of a and then of b.
func ints(a []string, b ...string) ([]int64, error) {
	out := make([]int64, 0, len(a)+len(b))
	for _, s := range append(a[:len(a):len(a)], b...) {
		v, err := parseInt(s)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

func code(rs, ws string) (int, int, error) {
	r, err := parseInt(rs)
	if err != nil {
		return 0, 0, err
	}
	w, err := parseInt(ws)
	if err != nil {
		return 0, 0, err
	}
	if r < 0 || r > snowflake.MaxRegion || w < 0 || w > snowflake.MaxWorker {
		return 0, 0, errors.Wrapf(ErrMalformed, "code %d/%d out of range", r, w)
	}
	return int(r), int(w), nil
}

func clip(b []byte) string {
	if len(b) > 80 {
		return string(b[:80]) + "..."
	}
	return string(b)
}

// CouldMintAt reports whether, by its own records, the process held at t a
// lease whose latest possible safety deadline and a block whose validity
// both extended past t+slack: a client in that state has no reason to
// refuse at t (a liveness expectation, e.g. "runs on its buffers when the
// lease service goes away").
func (h *History) CouldMintAt(t int64, slack time.Duration) bool {
	until := t + int64(slack)
	for _, l := range h.Leases {
		if l.Ret > t {
			continue
		}
		bound := l.Send + int64(l.TTL) - int64(h.Margin)
		for _, r := range h.Renewals {
			if r.Token == l.Token && r.Ret <= t {
				bound = max(bound, r.Send+int64(r.TTL)-int64(h.Margin))
			}
		}
		if bound <= until {
			continue
		}
		for _, b := range h.Blocks {
			if b.Token == l.Token && b.Ret <= t && b.Send+(b.ValidUntil-b.ServiceTime) > until {
				return true
			}
		}
	}
	return false
}

// LeaseAt returns the lease the process acquired last by t (the latest A
// line whose reply had returned at or before t); ok is false if none had.
func (h *History) LeaseAt(t int64) (Lease, bool) {
	var l Lease
	ok := false
	for _, x := range h.Leases {
		if x.Ret <= t && (!ok || x.Ret >= l.Ret) {
			l, ok = x, true
		}
	}
	return l, ok
}

// DeadlineBound is the latest safety deadline the process could have known
// at t for its lease with token: the largest send + TTL - margin over the
// acquisition and the renewals of that token whose replies had returned by
// t. It is the bound Check holds every ID to, so a client that mints right
// up to its own deadline hands out its last ID just before it. ok is false
// if the process had not acquired that lease by t.
func (h *History) DeadlineBound(token, t int64) (int64, bool) {
	var bound int64
	ok := false
	for _, l := range h.Leases {
		if l.Token == token && l.Ret <= t {
			bound, ok = l.Send+int64(l.TTL)-int64(h.Margin), true
		}
	}
	if !ok {
		return 0, false
	}
	for _, r := range h.Renewals {
		if r.Token == token && r.Ret <= t {
			bound = max(bound, r.Send+int64(r.TTL)-int64(h.Margin))
		}
	}
	return bound, true
}
