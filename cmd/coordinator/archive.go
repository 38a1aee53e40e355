package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/jobfence/jobfence/archiver"
	"github.com/jobfence/jobfence/store"
)

// checkRetention checks the archive's flags, naming the flag and giving an
// example.
func checkRetention(c config) error {
	switch {
	case c.retainSucceeded < 0 || (c.retainSucceeded > 0 && c.retainSucceeded < store.MinRetention):
		return fmt.Errorf("--retain-succeeded must be at least %s, or 0 to never archive, got %s (e.g. "+
			"--retain-succeeded=168h)", store.MinRetention, c.retainSucceeded)
	case c.archiveBatch < 1 || c.archiveBatch > store.MaxArchiveBatch:
		return fmt.Errorf("--archive-batch must be between 1 and %d, got %d (e.g. --archive-batch=500)",
			store.MaxArchiveBatch, c.archiveBatch)
	case c.archivePause < 0 || c.archivePause > time.Minute:
		return fmt.Errorf("--archive-pause must be between 0 and 1m, got %s (e.g. --archive-pause=100ms)", c.archivePause)
	case c.archiveInterval < time.Second || c.archiveInterval > time.Hour:
		return fmt.Errorf("--archive-interval must be between 1s and 1h, got %s (e.g. --archive-interval=1m)",
			c.archiveInterval)
	case c.archiveMaxPurge < 1:
		return fmt.Errorf("--archive-max-purge-backlog must be positive, got %d (e.g. --archive-max-purge-backlog=1000000)",
			c.archiveMaxPurge)
	case c.archiveOnce && c.retainSucceeded == 0:
		return errors.New("--archive-once needs a retention: --retain-succeeded is 0 (never archive)")
	case c.archiveOnce && c.migrateOnly:
		return errors.New("--archive-once and --migrate-only are one or the other")
	}
	for _, f := range []struct {
		name string
		v    int
	}{{"max-reads", c.maxReads}, {"max-reads-per-credential", c.maxReadsPerCred}, {"max-streams", c.maxStreams},
		{"max-streams-per-credential", c.maxStreamsPerCred}} {
		if f.v < 1 {
			return fmt.Errorf("--%s must be positive, got %d", f.name, f.v)
		}
	}
	return nil
}

// newArchiver is the archive of st as the flags set it, with its metrics
// on reg; nil with --retain-succeeded=0 (said at start).
func newArchiver(c config, st store.Store, reg prometheus.Registerer, log *slog.Logger) (*archiver.Archiver, error) {
	if c.retainSucceeded == 0 {
		log.Warn("--retain-succeeded=0: finished jobs are never archived, and the working tables grow without bound")
		return nil, nil
	}
	as, ok := st.(archiver.Store)
	if !ok {
		return nil, fmt.Errorf("the store %T keeps no archive", st)
	}
	a, err := archiver.New(as, archiver.Options{RetainSucceeded: c.retainSucceeded, Batch: c.archiveBatch,
		Pause: c.archivePause, Interval: c.archiveInterval, MaxPurgeBacklog: c.archiveMaxPurge,
		Metrics: archiver.NewMetrics(reg), Logger: log})
	if err != nil {
		return nil, err
	}
	log.Info("archive on", "retain_succeeded", c.retainSucceeded, "interval", c.archiveInterval)
	return a, nil
}

// archiveOnce is --archive-once: every job past its retention archived
// now, one run, a line when done.
func archiveOnce(ctx context.Context, c config, st store.Store, log *slog.Logger) error {
	a, err := newArchiver(c, st, prometheus.NewRegistry(), log)
	if err != nil {
		return err
	}
	began := time.Now()
	t, err := a.Once(ctx)
	a.Release()
	if errors.Is(err, store.ErrLeaseHeld) {
		return fmt.Errorf("--archive-once: another coordinator archives now (%w); it will archive these jobs too", err)
	}
	if err != nil {
		return fmt.Errorf("--archive-once: %w", err)
	}
	log.Info("archive done", "jobs", t.Jobs, "events", t.Events, "receipts", t.Observations, "batches", t.Batches,
		"took", time.Since(began).Round(time.Millisecond).String())
	return nil
}
