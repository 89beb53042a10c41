//go:build unix

package embedetcd

import (
	"os"
	"path/filepath"
	"syscall"

	"github.com/cockroachdb/errors"
)

// lockDir takes an exclusive, non-blocking lock on dir so that a second
// member on the same data directory fails at once instead of hanging inside
// etcd (its bbolt backend waits forever for the file lock).
func lockDir(dir string) (unlock func(), err error) {
	f, err := os.OpenFile(filepath.Join(dir, lockFile), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, errors.Wrapf(err, "embedetcd: lock data dir %q", dir)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, errors.Wrapf(ErrDirInUse, "%q", dir)
		}
		return nil, errors.Wrapf(err, "embedetcd: lock data dir %q", dir)
	}
	return func() { _ = f.Close() }, nil // closing releases the lock
}
