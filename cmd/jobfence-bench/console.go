package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/jobfence/jobfence/console"
	"github.com/jobfence/jobfence/server"
)

// consoleToken is the operator credential of scenario F's coordinator.
const consoleToken = "bench-console-operator-token"

// consoleRequests is how many times scenario F renders each page (quick:
// consoleRequestsQuick), after consoleWarmups.
const (
	consoleRequests      = 200
	consoleRequestsQuick = 20
	consoleWarmups       = 5
)

// consolePages measures scenario F: the operator console's pages at the full
// history, served as --console-listen serves them (console → in-memory gRPC →
// server, with authentication → the bench database), timed from the request
// to the last byte of the page: the server time a person waits for. The
// seeded history keeps one finished job in a hundred in manual review, so the
// review queue at 2M rows holds 20,000 jobs.
func (b *bench) consolePages(ctx context.Context) error {
	dir, err := os.MkdirTemp("", "jobfence-bench-console-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	sum := sha256.Sum256([]byte(consoleToken))
	tokens := filepath.Join(dir, "tokens")
	if err := os.WriteFile(tokens, []byte("bench operator sha256:"+hex.EncodeToString(sum[:])+"\n"), 0o600); err != nil {
		return err
	}
	authn, err := server.LoadTokens(tokens)
	if err != nil {
		return err
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	// The pages are rendered back to back to time them: the readers' share
	// (server.Options.ReadsPerSecond) would refuse most of them.
	srv := server.New(b.st, server.Options{Auth: authn, Logger: quiet, ReadsPerSecond: 1e6, ReadsPerSecondPerCredential: 1e6})
	defer srv.Close()
	conn, err := srv.InProcess()
	if err != nil {
		return err
	}
	defer conn.Close()
	h, err := console.New(console.Options{Coordinator: conn, Logger: quiet})
	if err != nil {
		return err
	}
	cookie, err := consoleSignIn(h)
	if err != nil {
		return err
	}
	var inReview, rows int
	if err := b.db.QueryRowContext(ctx, `SELECT COUNT(*), SUM(state = 'manual_review') FROM refund_jobs`).Scan(&rows, &inReview); err != nil {
		return err
	}
	var reviewID int64
	if err := b.db.QueryRowContext(ctx, `SELECT id FROM refund_jobs WHERE state = 'manual_review' ORDER BY id DESC LIMIT 1`).Scan(&reviewID); err != nil {
		return err
	}
	from := b.base.AddDate(0, 0, -3).Format(time.DateOnly)
	// slow marks the pages whose walk is bounded by the jobs in review, not
	// by the page: they are rendered a tenth as often.
	pages := []struct {
		name, path, want string
		slow             bool
	}{
		// The queue's first page, longest waiting first.
		{"review_queue", "/reviews", "seeded: provider has no record", false},
		{"review_queue_provider", "/reviews?provider=acme", "seeded: provider has no record", false},
		// The newest three days: the walk starts at them on the index.
		{"review_queue_created", "/reviews?from=" + from, "seeded: provider has no record", false},
		// The worst filter: a reason nothing has walks every job in review.
		{"review_queue_reason_miss", "/reviews?reason=" + url.QueryEscape("no such reason"), "No jobs.", true},
		{"job", fmt.Sprintf("/jobs/%d", reviewID), "History", false},
		{"search_order", "/search?by=order_id&q=order-h-000000099", "hist-000000099", false},
		{"overview", "/", "Waiting longest", false},
	}
	n := consoleRequests
	if b.cfg.quick {
		n = consoleRequestsQuick
	}
	for _, p := range pages {
		var lat latencies
		count := n
		if p.slow {
			count = max(n/10, 5)
		}
		for i := range consoleWarmups + count {
			req := httptest.NewRequestWithContext(ctx, http.MethodGet, p.path, nil)
			req.AddCookie(cookie)
			rec := httptest.NewRecorder()
			start := time.Now()
			h.ServeHTTP(rec, req)
			d := time.Since(start)
			if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), p.want) {
				return fmt.Errorf("console page %s: %d, want 200 with %q:\n%.2000s", p.path, rec.Code, p.want, rec.Body.String())
			}
			if i >= consoleWarmups {
				lat = append(lat, d)
			}
		}
		b.summary("console_page", "page", p.name, "rows", rows, "in_review", inReview, "requests", count,
			"p50_ms", ms(lat.percentile(0.50)), "p95_ms", ms(lat.percentile(0.95)), "p99_ms", ms(lat.percentile(0.99)))
	}
	return nil
}

var csrfField = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// consoleSignIn signs the bench's operator in and returns the session cookie.
func consoleSignIn(h http.Handler) (*http.Cookie, error) {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/signin", nil))
	m := csrfField.FindStringSubmatch(rec.Body.String())
	if m == nil {
		return nil, fmt.Errorf("console: no sign-in form")
	}
	form := url.Values{"csrf": {m[1]}, "token": {consoleToken}}
	req := httptest.NewRequest(http.MethodPost, "/signin", strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for _, c := range rec.Result().Cookies() {
		req.AddCookie(c)
	}
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	for _, c := range rec.Result().Cookies() {
		if c.Name == "jobfence_session" && c.Value != "" {
			return c, nil
		}
	}
	return nil, fmt.Errorf("console: sign-in failed: %d %s", rec.Code, rec.Body.String())
}
