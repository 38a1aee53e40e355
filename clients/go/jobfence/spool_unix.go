//go:build unix

package jobfence

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"syscall"
)

// lockSpool takes the spool's lock file: an exclusive flock, which the
// kernel drops when the holder dies, and the holder's pid in the file, so
// that the Node SDK, which cannot flock, sees a Go worker holding it, and a
// Go worker sees a Node worker holding it by a live pid. Errors:
// ErrReceiptSpoolLocked naming the holder; file system errors.
func lockSpool(path string) (*os.File, error) {
	for {
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			return nil, err
		}
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			pid := lockHolder(f)
			f.Close()
			if errors.Is(err, syscall.EWOULDBLOCK) {
				return nil, fmt.Errorf("%w (pid %d)", ErrReceiptSpoolLocked, pid)
			}
			return nil, err
		}
		// A holder that released between our open and our flock removed
		// the file: this lock is on a name nobody else will open. Again.
		var held, named syscall.Stat_t
		if syscall.Fstat(int(f.Fd()), &held) != nil || syscall.Stat(path, &named) != nil ||
			held.Dev != named.Dev || held.Ino != named.Ino {
			f.Close()
			continue
		}
		if pid := lockHolder(f); pid != 0 && pid != os.Getpid() && processAlive(pid) {
			// No flock, yet a live pid: a Node worker's lock. Leave it.
			f.Close()
			return nil, fmt.Errorf("%w (pid %d)", ErrReceiptSpoolLocked, pid)
		}
		if err := f.Truncate(0); err == nil {
			_, err = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
		}
		if err == nil {
			err = f.Sync()
		}
		if err != nil {
			f.Close()
			return nil, err
		}
		return f, nil
	}
}

// unlockSpool removes the lock file while still holding it, then lets go.
func unlockSpool(f *os.File, path string) {
	os.Remove(path) //nolint:errcheck // a lock file left behind is stale by its pid and flock alike
	f.Close()
}

// processAlive: signal 0 reaches the process, or it exists under another
// user (EPERM).
func processAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}
