package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The tables a window counts. The working tables are counted exactly: they
// are what must stay bounded, and COUNT(*) of a bounded table stays cheap.
// The archive tables and the key table grow for ever by design; counting
// them exactly every window would scan ever more pages, and on a server
// whose buffer pool they outgrow (MariaDB's default is 128 MiB) push the
// working tables' pages out: the soak would measure its own counting. They
// are read from InnoDB's row estimate (information_schema.TABLES), and the
// final checks count them exactly and report how far the estimate was off.
var (
	workingTables = []string{"refund_jobs", "refund_job_events", "refund_observations"}
	archiveTables = []string{"refund_jobs_archive", "refund_job_events_archive", "refund_observations_archive"}
	keyTable      = "refund_operation_keys"
)

// window is one --sample of the run: what happened in it, and what the
// database and the coordinator looked like at its end.
type window struct {
	N          int
	Start, End time.Duration // since the producer's schedule began

	Enqueued  int64     // enqueues answered in it
	Completed int64     // jobs completed in it
	lat       latencies // their enqueue→completed
	P50, P99  time.Duration
	MaxLag    time.Duration // the latest first call of a job against its schedule

	Working    [3]int64 // exact rows of workingTables
	Archive    [3]int64 // estimated rows of archiveTables
	Keys       int64    // estimated rows of keyTable
	CountTook  time.Duration
	HistoryLen int64   // InnoDB's history list length; -1 unread
	RSS        float64 // the coordinator's resident bytes; NaN unread (restarting)
	Goroutines float64 // NaN unread
	Behind     float64 // jobfence_archive_behind_seconds; NaN unread
	CoordCPU   float64 // the share of one core the coordinator used in the window; NaN unread
	Load       string  // the machine's 1-minute load average at the end

	// Excluded says why the verdict leaves the window out ("warm-up",
	// "restart"); empty when it compares it.
	Excluded string
}

// accumulator gathers the window in progress.
type accumulator struct {
	mu     sync.Mutex
	enq    int64 // enqueues answered
	done   int64 // jobs completed
	lat    latencies
	maxLag time.Duration
}

func (a *accumulator) sent(lag time.Duration) {
	a.mu.Lock()
	a.maxLag = max(a.maxLag, lag)
	a.mu.Unlock()
}

func (a *accumulator) enqueued() {
	a.mu.Lock()
	a.enq++
	a.mu.Unlock()
}

func (a *accumulator) completed(d time.Duration) {
	a.mu.Lock()
	a.done++
	a.lat = append(a.lat, d)
	a.mu.Unlock()
}

// take ends the window in progress as window n and starts the next.
func (a *accumulator) take(n int, start, end time.Duration) window {
	a.mu.Lock()
	w := window{N: n, Start: start, End: end, Enqueued: a.enq, Completed: a.done, lat: a.lat, MaxLag: a.maxLag}
	a.enq, a.done, a.lat, a.maxLag = 0, 0, nil, 0
	a.mu.Unlock()
	w.P50, w.P99 = w.lat.percentile(0.50), w.lat.percentile(0.99)
	return w
}

// measure reads the database's and the coordinator's side of window w. A
// failed read is a functional failure, but for the coordinator's metrics
// while it restarts.
func (s *soak) measure(ctx context.Context, w *window) {
	w.HistoryLen, w.RSS, w.Goroutines, w.Behind, w.CoordCPU = -1, math.NaN(), math.NaN(), math.NaN(), math.NaN()
	w.Load = loadAvg()
	began := time.Now()
	err := s.db.QueryRowContext(ctx, `SELECT (SELECT COUNT(*) FROM refund_jobs), (SELECT COUNT(*) FROM refund_job_events), `+
		`(SELECT COUNT(*) FROM refund_observations)`).Scan(&w.Working[0], &w.Working[1], &w.Working[2])
	w.CountTook = time.Since(began)
	if err != nil && ctx.Err() == nil {
		s.fail("window %d: count the working tables: %v", w.N, err)
	}
	est, err := s.estimates(ctx)
	if err != nil && ctx.Err() == nil {
		s.fail("window %d: %v", w.N, err)
	}
	for i, t := range archiveTables {
		w.Archive[i] = est[t]
	}
	w.Keys = est[keyTable]
	if err := s.db.QueryRowContext(ctx, historyLenQuery).Scan(&w.HistoryLen); err != nil && ctx.Err() == nil {
		s.fail("window %d: read the history list length: %v", w.N, err)
	}
	c := s.current()
	if c == nil {
		s.coordCPU.share(0, 0)
		return // restarting: no coordinator to read
	}
	w.CoordCPU = s.coordCPU.share(c.pid(), s.clock())
	m, err := scrapeMetrics(ctx, c.metrics())
	if err != nil {
		if !s.restarting() && ctx.Err() == nil {
			s.fail("window %d: coordinator pid %d: %v", w.N, c.pid(), err)
		}
		return
	}
	w.RSS = m.get("process_resident_memory_bytes")
	w.Goroutines = m.get("go_goroutines")
	w.Behind = m.get("jobfence_archive_behind_seconds")
}

// historyLenQuery reads InnoDB's history list length: undo records the
// purge has yet to remove, which grows when deletes (the archive's) outrun
// it.
const historyLenQuery = `SELECT count FROM information_schema.INNODB_METRICS WHERE name = 'trx_rseg_history_len'`

// estimates reads InnoDB's row estimates of the archive tables and the key
// table.
func (s *soak) estimates(ctx context.Context) (map[string]int64, error) {
	names := append(slices.Clone(archiveTables), keyTable)
	rows, err := s.db.QueryContext(ctx, `SELECT TABLE_NAME, COALESCE(TABLE_ROWS, 0) FROM information_schema.TABLES `+
		`WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME IN ('`+strings.Join(names, "', '")+`')`)
	if err != nil {
		return nil, fmt.Errorf("row estimates: %w", err)
	}
	defer rows.Close()
	out := map[string]int64{}
	for rows.Next() {
		var name string
		var n int64
		if err := rows.Scan(&name, &n); err != nil {
			return nil, err
		}
		out[name] = n
	}
	return out, rows.Err()
}

// progress is window w's progress line.
func (w window) progress(of int) string {
	return fmt.Sprintf("window %d/%d: enqueued %d completed %d, p50 %s p99 %s ms, working jobs %d events %d "+
		"receipts %d, archive ~%d jobs, keys ~%d, RSS %s MiB, goroutines %s, coordinator CPU %s%%, history %d, "+
		"behind %s s, load %s",
		w.N, of, w.Enqueued, w.Completed, msec(w.P50), msec(w.P99), w.Working[0], w.Working[1], w.Working[2],
		w.Archive[0], w.Keys, num(w.RSS/(1<<20), 1), num(w.Goroutines, 0), num(100*w.CoordCPU, 0), w.HistoryLen, num(w.Behind, 1), w.Load)
}

// promSample is one scrape of Prometheus' text format: series → value.
type promSample map[string]float64

// get is series' value, NaN when absent.
func (p promSample) get(series string) float64 {
	if v, ok := p[series]; ok {
		return v
	}
	return math.NaN()
}

// scrapeMetrics reads the coordinator's /metrics at addr.
func scrapeMetrics(ctx context.Context, addr string) (promSample, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scrape metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scrape metrics: %s", resp.Status)
	}
	return parseMetrics(resp.Body)
}

// parseMetrics reads Prometheus' text format: "series value" lines,
// comments skipped.
func parseMetrics(r io.Reader) (promSample, error) {
	out := promSample{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		out[strings.TrimSpace(line[:i])] = v
	}
	return out, sc.Err()
}

// latencies is a set of measured durations.
type latencies []time.Duration

// percentile is the nearest-rank percentile p (0 < p ≤ 1); zero when empty.
func (l latencies) percentile(p float64) time.Duration {
	if len(l) == 0 {
		return 0
	}
	s := slices.Clone(l)
	slices.Sort(s)
	rank := int(math.Ceil(p*float64(len(s)))) - 1
	return s[max(0, min(rank, len(s)-1))]
}

// msec formats d in milliseconds with a tenth.
func msec(d time.Duration) string { return fmt.Sprintf("%.1f", float64(d)/float64(time.Millisecond)) }

// num formats x with the given decimals; "n/a" when it is not a number.
func num(x float64, decimals int) string {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return "n/a"
	}
	return fmt.Sprintf("%.*f", decimals, x)
}
