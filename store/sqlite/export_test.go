package sqlite

import "context"

// OpenMigratedTo is Open with the migrations applied up to version upTo
// only: the schema an earlier release left.
func OpenMigratedTo(ctx context.Context, path string, upTo int) (*Store, error) {
	return open(ctx, path, Options{}, upTo, true)
}

// OpenSharing is Open without the process lock, as on a platform without
// flock: for tests of two stores on one file.
func OpenSharing(ctx context.Context, path string) (*Store, error) {
	return open(ctx, path, Options{}, allMigrations, false)
}
