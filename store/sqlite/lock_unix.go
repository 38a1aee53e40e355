//go:build unix

package sqlite

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// processLock is an exclusive lock on path+".lock" for the life of a Store:
// the embedded store serves one process (its long-poll wake-ups and its
// single-node promise assume it), so a second coordinator on the same file is
// refused instead of serving beside the first. The lock is the kernel's
// (flock), so a process that dies releases it.
type processLock struct{ f *os.File }

func lockFile(dbPath string) (*processLock, error) {
	path := dbPath + ".lock"
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o640)
	if err != nil {
		return nil, fmt.Errorf("sqlite: lock %s: %w", path, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		holder, _ := os.ReadFile(path)
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("sqlite: %s is in use by another process (pid %s): the embedded store serves one "+
				"coordinator; stop that one first, or run several on MySQL (--mysql-dsn)", dbPath, pidOf(holder))
		}
		return nil, fmt.Errorf("sqlite: lock %s: %w", path, err)
	}
	// Who holds it, for the message above; the lock itself is the flock.
	if err := f.Truncate(0); err == nil {
		f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0) //nolint:errcheck
	}
	return &processLock{f: f}, nil
}

func pidOf(holder []byte) string {
	if pid := strings.TrimSpace(string(holder)); pid != "" {
		return pid
	}
	return "unknown"
}

// release unlocks (closing the file releases the flock); again, it does
// nothing.
func (l *processLock) release() error {
	if l.f == nil {
		return nil
	}
	err := l.f.Close()
	l.f = nil
	return err
}
