package snowflake

import (
	"errors"
	"sync"
	"testing"
)

// flakyHighWater is a MemHighWater that counts successful stores (to check
// that minting does not write per ID) and can be told to fail (to test
// persistence failures).
type flakyHighWater struct {
	MemHighWater
	mu   sync.Mutex
	n    int
	fail error
}

// setFail makes every later Store return err (nil restores normal operation).
func (f *flakyHighWater) setFail(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fail = err
}

func (f *flakyHighWater) stores() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.n
}

func (f *flakyHighWater) Store(ms int64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail != nil {
		return f.fail
	}
	if err := f.MemHighWater.Store(ms); err != nil {
		return err
	}
	f.n++
	return nil
}

// FuzzDecodeHighWater: FileHighWater's decoder accepts only what its encoder
// writes, and reports everything else as ErrHighWaterCorrupt.
func FuzzDecodeHighWater(f *testing.F) {
	f.Add([]byte("idrange-hwm v1 12345\n"))
	f.Add([]byte("idrange-hwm v1 -1\n"))
	f.Add([]byte(""))
	f.Fuzz(func(t *testing.T, b []byte) {
		ms, err := decodeHighWater(b)
		if err != nil {
			if !errors.Is(err, ErrHighWaterCorrupt) {
				t.Fatalf("error %v is not ErrHighWaterCorrupt", err)
			}
			return
		}
		if string(encodeHighWater(ms)) != string(b) {
			t.Fatalf("accepted %q which does not re-encode to itself", b)
		}
	})
}
