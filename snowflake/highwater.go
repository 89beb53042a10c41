package snowflake

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
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

var (
	_ HighWaterStore = (*FileHighWater)(nil)
	_ HighWaterStore = (*MemHighWater)(nil)
)

// errLowered is returned by stores asked to move the ceiling down.
var errLowered = errors.New("snowflake: high-water mark may only grow")

// highWaterHeader starts the one-line file format "idrange-hwm v1 <ms>\n".
const highWaterHeader = "idrange-hwm v1 "

// encodeHighWater is FileHighWater's file form of a ceiling.
func encodeHighWater(ms int64) []byte {
	return []byte(highWaterHeader + strconv.FormatInt(ms, 10) + "\n")
}

// decodeHighWater parses the file form strictly: header, decimal ms in
// 0..MaxTimestamp without leading zeros, one newline, nothing else: only
// what encodeHighWater writes.
func decodeHighWater(b []byte) (int64, error) {
	s := string(b)
	rest, ok := strings.CutPrefix(s, highWaterHeader)
	if !ok {
		return 0, fmt.Errorf("missing header %q: %w", highWaterHeader, ErrHighWaterCorrupt)
	}
	digits, ok := strings.CutSuffix(rest, "\n")
	if !ok || digits == "" || strings.ContainsAny(digits, "\n+- ") {
		return 0, fmt.Errorf("malformed value %q: %w", rest, ErrHighWaterCorrupt)
	}
	if len(digits) > 1 && digits[0] == '0' {
		return 0, fmt.Errorf("value %q has a leading zero, which the encoder never writes: %w", digits, ErrHighWaterCorrupt)
	}
	ms, err := strconv.ParseInt(digits, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("value %q is not a decimal integer: %w", digits, ErrHighWaterCorrupt)
	}
	if ms < 0 || ms > MaxTimestamp {
		return 0, fmt.Errorf("value %d not in 0..%d: %w", ms, int64(MaxTimestamp), ErrHighWaterCorrupt)
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
		return 0, false, fmt.Errorf("read high-water file %s: %w", f.path, err)
	}
	ms, err := decodeHighWater(b)
	if err != nil {
		return 0, false, fmt.Errorf("high-water file %s: %w", f.path, err)
	}
	f.last = max(f.last, ms)
	return ms, true, nil
}

// Store durably replaces the file's value with ms.
func (f *FileHighWater) Store(ms int64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if ms < f.last {
		return fmt.Errorf("store %d below %d in %s: %w", ms, f.last, f.path, errLowered)
	}
	dir := filepath.Dir(f.path)
	tmp, err := os.CreateTemp(dir, filepath.Base(f.path)+".tmp*")
	if err != nil {
		return fmt.Errorf("create temporary high-water file: %w", err)
	}
	defer os.Remove(tmp.Name()) // no-op after a successful rename
	if _, err := tmp.Write(encodeHighWater(ms)); err != nil {
		tmp.Close()
		return fmt.Errorf("write high-water file: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("fsync high-water file: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("close high-water file: %w", err)
	}
	if err := os.Rename(tmp.Name(), f.path); err != nil {
		return fmt.Errorf("rename high-water file into place: %w", err)
	}
	if d, err := os.Open(dir); err == nil {
		err = d.Sync()
		d.Close()
		if err != nil {
			return fmt.Errorf("fsync directory %s: %w", dir, err)
		}
	} else {
		return fmt.Errorf("open directory %s: %w", dir, err)
	}
	f.last = ms
	return nil
}

// MemHighWater is an in-memory HighWaterStore, for tests and for callers
// whose durability comes from elsewhere (such as an etcd lease + HWM): a
// restarted process forgets it. The zero value is empty and ready to use.
type MemHighWater struct {
	mu sync.Mutex
	ms int64
	ok bool
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
	if m.ok && ms < m.ms {
		return fmt.Errorf("store %d below %d: %w", ms, m.ms, errLowered)
	}
	m.ms, m.ok = ms, true
	return nil
}
