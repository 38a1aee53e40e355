package sqlite

import "context"

// OpenMigratedTo is Open with the migrations applied up to version upTo
// only: the schema an earlier release left.
func OpenMigratedTo(ctx context.Context, path string, upTo int) (*Store, error) {
	return open(ctx, path, Options{}, upTo)
}
