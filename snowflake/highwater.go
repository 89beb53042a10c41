package snowflake

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/cockroachdb/errors"
)

// HighWaterStore persists a generator's timestamp ceiling: the highest
// millisecond it may have minted in. A restarted generator starts strictly
// above it, so a crash and a clock set back can never re-enter used space.
//
// Store must be durable when it returns and must refuse to lower the value.
type HighWaterStore interface {
	// Load returns the persisted ceiling; ok is false when none was ever
	// stored. A value that cannot be read back exactly is an error, never 0.
	Load() (ms int64, ok bool, err error)
	// Store durably records ms as the new ceiling.
	Store(ms int64) error
}

// ErrHighWaterCorrupt: the persisted high-water mark cannot be decoded. The
// generator refuses to start rather than guess.
var ErrHighWaterCorrupt = errors.New("snowflake: high-water mark is corrupt")

// errLowered is returned by stores asked to move the ceiling down.
var errLowered = errors.New("snowflake: high-water mark may only grow")

// highWaterHeader starts the one-line file format "idrange-hwm v1 <ms>\n".
const highWaterHeader = "idrange-hwm v1 "

// EncodeHighWater is the file form of a ceiling.
func EncodeHighWater(ms int64) []byte {
	return []byte(highWaterHeader + strconv.FormatInt(ms, 10) + "\n")
}

// DecodeHighWater parses the file form strictly: header, decimal ms in
// 0..MaxTimestamp, one newline, nothing else.
func DecodeHighWater(b []byte) (int64, error) {
	s := string(b)
	rest, ok := strings.CutPrefix(s, highWaterHeader)
	if !ok {
		return 0, errors.Wrapf(ErrHighWaterCorrupt, "missing header %q", highWaterHeader)
	}
	digits, ok := strings.CutSuffix(rest, "\n")
	if !ok || digits == "" || strings.ContainsAny(digits, "\n+- ") {
		return 0, errors.Wrapf(ErrHighWaterCorrupt, "malformed value %q", rest)
	}
	ms, err := strconv.ParseInt(digits, 10, 64)
	if err != nil {
		return 0, errors.Wrapf(ErrHighWaterCorrupt, "value %q is not a decimal integer", digits)
	}
	if ms < 0 || ms > MaxTimestamp {
		return 0, errors.Wrapf(ErrHighWaterCorrupt, "value %d not in 0..%d", ms, int64(MaxTimestamp))
	}
	return ms, nil
}

// FileHighWater keeps the ceiling in one small file, replaced atomically
// (write temporary file, fsync, rename, fsync directory) so a crash leaves
// either the old or the new value, never a torn one.
type FileHighWater struct {
	path string
	mu   sync.Mutex
	last int64
}

// NewFileHighWater returns a store at path; the file is created by the first
// Store. Give each worker code its own file.
func NewFileHighWater(path string) *FileHighWater { return &FileHighWater{path: path, last: -1} }

// Load reads the file. A missing file means a fresh start (ok false).
func (f *FileHighWater) Load() (int64, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, err := os.ReadFile(f.path)
	if errors.Is(err, os.ErrNotExist) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, errors.Wrapf(err, "read high-water file %s", f.path)
	}
	ms, err := DecodeHighWater(b)
	if err != nil {
		return 0, false, errors.Wrapf(err, "high-water file %s", f.path)
	}
	f.last = max(f.last, ms)
	return ms, true, nil
}

// Store durably replaces the file's value with ms.
func (f *FileHighWater) Store(ms int64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if ms < f.last {
		return errors.Wrapf(errLowered, "store %d below %d in %s", ms, f.last, f.path)
	}
	dir := filepath.Dir(f.path)
	tmp, err := os.CreateTemp(dir, filepath.Base(f.path)+".tmp*")
	if err != nil {
		return errors.Wrap(err, "create temporary high-water file")
	}
	defer os.Remove(tmp.Name()) // no-op after a successful rename
	if _, err := tmp.Write(EncodeHighWater(ms)); err != nil {
		tmp.Close()
		return errors.Wrap(err, "write high-water file")
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return errors.Wrap(err, "fsync high-water file")
	}
	if err := tmp.Close(); err != nil {
		return errors.Wrap(err, "close high-water file")
	}
	if err := os.Rename(tmp.Name(), f.path); err != nil {
		return errors.Wrap(err, "rename high-water file into place")
	}
	if d, err := os.Open(dir); err == nil {
		err = d.Sync()
		d.Close()
		if err != nil {
			return errors.Wrapf(err, "fsync directory %s", dir)
		}
	} else {
		return errors.Wrapf(err, "open directory %s", dir)
	}
	f.last = ms
	return nil
}

// MemHighWater is an in-memory HighWaterStore for tests and for callers whose
// durability comes from elsewhere (such as an etcd lease + HWM).
type MemHighWater struct {
	mu     sync.Mutex
	ms     int64
	ok     bool
	stores int
	fail   error
}

// SetFail makes every later Store return err (nil restores normal
// operation), to test persistence failures.
func (m *MemHighWater) SetFail(err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.fail = err
}

// NewMemHighWater returns an empty in-memory store.
func NewMemHighWater() *MemHighWater { return &MemHighWater{} }

// Load returns the stored value.
func (m *MemHighWater) Load() (int64, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.ms, m.ok, nil
}

// Store records ms.
func (m *MemHighWater) Store(ms int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fail != nil {
		return m.fail
	}
	if m.ok && ms < m.ms {
		return errors.Wrapf(errLowered, "store %d below %d", ms, m.ms)
	}
	m.ms, m.ok = ms, true
	m.stores++
	return nil
}

// Stores counts successful Store calls (to check that minting does not write
// per ID).
func (m *MemHighWater) Stores() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.stores
}

// String describes the store for logs.
func (m *MemHighWater) String() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return fmt.Sprintf("mem-hwm(ms=%d ok=%v)", m.ms, m.ok)
}
