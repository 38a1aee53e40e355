//go:build !unix

package jobfence

import (
	"errors"
	"fmt"
	"os"
)

// lockSpool needs flock, which this platform lacks: set
// WorkerOptions.ReceiptSpool to ReceiptSpoolOff here.
func lockSpool(string) (*os.File, error) {
	return nil, fmt.Errorf("locking the receipt spool: %w (set ReceiptSpool to %q)", errors.ErrUnsupported, ReceiptSpoolOff)
}

func unlockSpool(f *os.File, _ string) { f.Close() }
