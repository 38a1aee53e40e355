//go:build !unix

package sqlite

// processLock is a no-op where flock is not available: run one coordinator
// per file there (docs/DEPLOY.md).
type processLock struct{}

func lockFile(string) (*processLock, error) { return &processLock{}, nil }

func (*processLock) release() error { return nil }
