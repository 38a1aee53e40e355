package cli

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// BuildCoordinator builds ./cmd/coordinator into a new temporary folder
// named after prefix, for a command that runs coordinators (the bench, the
// soak) when it was given no binary. It returns the binary and the folder,
// which the caller removes. It must run from within the module.
func BuildCoordinator(ctx context.Context, prefix string) (bin, dir string, err error) {
	dir, err = os.MkdirTemp("", prefix)
	if err != nil {
		return "", "", err
	}
	bin = filepath.Join(dir, "coordinator")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/jobfence/jobfence/cmd/coordinator")
	if out, err := cmd.CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return "", "", fmt.Errorf("build the coordinator (run from the module, or give --coordinator-bin): %v\n%s", err, out)
	}
	return bin, dir, nil
}
