package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"syscall"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/jobfence/jobfence/archiver"
	"github.com/jobfence/jobfence/server"
	"github.com/jobfence/jobfence/store"
)

// checkRetention checks the archive's flags, naming the flag and giving an
// example.
func checkRetention(c config) error {
	switch {
	case c.retainSucceeded < 0 || (c.retainSucceeded > 0 && c.retainSucceeded < store.MinRetention):
		return fmt.Errorf("--retain-succeeded must be at least %s, or 0 to never archive, got %s (e.g. "+
			"--retain-succeeded=168h)", store.MinRetention, c.retainSucceeded)
	case c.retainCancelled < 0 || (c.retainCancelled > 0 && c.retainCancelled < store.MinRetention):
		return fmt.Errorf("--retain-cancelled must be at least %s, or 0 to never archive cancelled jobs, got %s (e.g. "+
			"--retain-cancelled=168h)", store.MinRetention, c.retainCancelled)
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
	case (c.exportTo == "") != (c.exportBefore == ""):
		return errors.New("--archive-export and --archive-export-before go together (e.g. --archive-export " +
			"archive-2025.jsonl --archive-export-before 2026-01-01)")
	case c.exportTo != "" && (c.archiveOnce || c.migrateOnly):
		return errors.New("--archive-export is a command of its own: not with --archive-once or --migrate-only")
	}
	if c.exportBefore != "" {
		if _, err := parseBefore(c.exportBefore); err != nil {
			return err
		}
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
	for _, f := range []struct {
		name string
		v    float64
	}{{"reads-per-second", c.readsPerSecond}, {"reads-per-second-per-credential", c.readsPerSecCred}} {
		if f.v < 0.1 || f.v > 100000 {
			return fmt.Errorf("--%s must be between 0.1 and 100000, got %g (e.g. --%[1]s=20)", f.name, f.v)
		}
	}
	return nil
}

// newArchiver is the archive of st as the flags set it, with its metrics
// on reg; nil with --retain-succeeded=0 (said at start).
func newArchiver(c config, st store.Store, reg prometheus.Registerer, log *slog.Logger, holder string) (*archiver.Archiver, error) {
	if c.retainSucceeded == 0 {
		log.Warn("--retain-succeeded=0: finished jobs are never archived, and the working tables grow without bound")
		return nil, nil
	}
	as, ok := st.(archiver.Store)
	if !ok {
		return nil, fmt.Errorf("the store %T keeps no archive", st)
	}
	a, err := archiver.New(as, archiver.Options{RetainSucceeded: c.retainSucceeded, RetainCancelled: c.retainCancelled,
		Batch: c.archiveBatch,
		Pause: c.archivePause, Interval: c.archiveInterval, MaxPurgeBacklog: c.archiveMaxPurge,
		Holder: holder, Metrics: archiver.NewMetrics(reg), Logger: log})
	if err != nil {
		return nil, err
	}
	log.Info("archive on", "retain_succeeded", c.retainSucceeded, "retain_cancelled", c.retainCancelled,
		"interval", c.archiveInterval)
	return a, nil
}

// archiveOnce is --archive-once: every job past its retention archived
// now, one run, a line when done.
func archiveOnce(ctx context.Context, c config, st store.Store, log *slog.Logger) error {
	a, err := newArchiver(c, st, prometheus.NewRegistry(), log, "") // host and pid: never a serving coordinator's
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

// parseBefore reads --archive-export-before: a date (UTC midnight) or an
// RFC 3339 time, not in the future.
func parseBefore(s string) (time.Time, error) {
	t, err := time.Parse("2006-01-02", s)
	if err != nil {
		if t, err = time.Parse(time.RFC3339, s); err != nil {
			return time.Time{}, fmt.Errorf("--archive-export-before %q is not a date like 2026-01-01 or a time like "+
				"2026-01-01T00:00:00Z", s)
		}
	}
	if t.After(time.Now()) {
		return time.Time{}, fmt.Errorf("--archive-export-before %s is in the future", s)
	}
	return t.UTC(), nil
}

// exporter is what --archive-export needs of the store.
type exporter interface {
	ArchivedBefore(ctx context.Context, before time.Time, after int64, limit int) ([]store.JobDetail, error)
	DropArchived(ctx context.Context, ids []int64) error
}

// exportBatch is how many archived jobs one export step writes, then drops.
const exportBatch = 200

// exportArchive is --archive-export: batch after batch, the archived jobs
// that left before the date are written to the file, one JSON line each,
// the file is synced, and only then their archive rows are dropped, so that
// a crash loses nothing (a batch written twice is a repeat of the same
// lines). A progress line per batch.
func exportArchive(ctx context.Context, c config, st store.Store, log *slog.Logger) error {
	ex, ok := st.(exporter)
	if !ok {
		return fmt.Errorf("the store %T keeps no archive", st)
	}
	before, err := parseBefore(c.exportBefore)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(c.exportTo, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("--archive-export: %w", err)
	}
	defer f.Close()
	w := bufio.NewWriter(f)
	var after int64
	jobs := 0
	began := time.Now()
	for {
		ds, err := ex.ArchivedBefore(ctx, before, after, exportBatch)
		if err != nil {
			return fmt.Errorf("--archive-export: %w", err)
		}
		if len(ds) == 0 {
			break
		}
		ids := make([]int64, len(ds))
		for i, d := range ds {
			line, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(server.JobDetailToProto(d))
			if err != nil {
				return err
			}
			w.Write(line)
			w.WriteByte('\n')
			ids[i] = d.Job.ID
		}
		if err := w.Flush(); err != nil {
			return fmt.Errorf("--archive-export %s: %w", c.exportTo, err)
		}
		if err := f.Sync(); err != nil && !errors.Is(err, syscall.EINVAL) { // /dev/null syncs nothing
			return fmt.Errorf("--archive-export %s: %w", c.exportTo, err)
		}
		if err := ex.DropArchived(ctx, ids); err != nil {
			return fmt.Errorf("--archive-export: written to %s but not dropped (the next run writes them again): %w",
				c.exportTo, err)
		}
		jobs += len(ds)
		after = ids[len(ids)-1]
		log.Info("archive export", "jobs", jobs, "last_job_id", after, "to", c.exportTo)
	}
	log.Info("archive export done", "jobs", jobs, "before", before.Format(time.RFC3339), "to", c.exportTo,
		"took", time.Since(began).Round(time.Millisecond).String())
	return nil
}
