// Package browser drives a real headless Chromium for end-to-end tests of
// server-rendered web pages (the operator console): forms, a session cookie
// and CSRF tokens, exercised the way a person's browser does.
//
// Start launches one browser for a test; NewSession opens a Session in it,
// each with its own browser context (its own cookie jar, like an incognito
// window), so one test can sign in two people at once. A Session's actions
// (Navigate, Fill, Click, Submit, Text, PostForm…) each have a timeout of
// ActionTimeout and fail the test with a message naming the action and the
// page's URL; Run is the escape hatch for any chromedp action and returns
// the error instead.
//
// Chromium is mandatory: Start fails, never skips, when none is installed;
// it skips only under go test -short, which leaves the browser tests to the
// full run (make test, CI).
// It takes $JOBFENCE_CHROMIUM when set, else chromium or chromium-browser on
// PATH, else /usr/bin/chromium (Debian's chromium package, which .ci/run
// installs).
package browser

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// ActionTimeout bounds each action of a Session, including the page load
// that Navigate, Click, Submit and PostForm wait for.
const ActionTimeout = 15 * time.Second

// startTimeout bounds the launch of the browser and the opening of a
// Session's tab; a cold start on a busy CI machine takes a few seconds.
const startTimeout = 30 * time.Second

// closeTimeout bounds the graceful close of the browser at cleanup, after
// which the allocator kills it.
const closeTimeout = 10 * time.Second

// EnvChromium names the environment variable that overrides which Chromium
// executable Start runs.
const EnvChromium = "JOBFENCE_CHROMIUM"

// flags are the switches the browser runs with, and the only ones we pass
// (chromedp adds --remote-debugging-pipe and about:blank; --user-data-dir is
// a fresh directory per test). --no-sandbox because CI runs as root, where
// Chromium's sandbox refuses to start.
var flags = []string{
	"headless",
	"no-sandbox",
	"disable-gpu",
	"disable-background-networking",
	"disable-component-update",
	"no-first-run",
}

// Browser is one headless Chromium process owned by a test. It is closed,
// with every child process, when that test ends.
type Browser struct {
	// ctx is the chromedp context of the browser's first tab; Sessions are
	// children of it, each in a browser context of its own.
	ctx  context.Context
	path string
	dir  string // the profile (--user-data-dir), which every child process names
}

// Start launches a headless Chromium for t and registers its shutdown with
// t.Cleanup. It fails t (never skips) when no Chromium executable is found
// or the browser does not start within 30 s. Under go test -short it skips
// t without looking for one.
func Start(t testing.TB) *Browser {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: drives a headless Chromium")
	}
	path, err := findChromium()
	if err != nil {
		t.Fatal(err)
	}
	log := &testLog{t: t}
	dir := t.TempDir()
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path),
		chromedp.UserDataDir(dir),
	}
	for _, f := range flags {
		opts = append(opts, chromedp.Flag(f, true))
	}
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(allocCtx,
		chromedp.WithLogf(log.logf), chromedp.WithErrorf(log.errorf))
	// Cleanup order: close the browser gracefully, then cancel the allocator,
	// which kills the process if it is still there and waits for it; then
	// kill any child that outlived it. t.TempDir's own cleanup, registered
	// earlier, removes the profile after that.
	t.Cleanup(func() {
		cctx, ccancel := context.WithTimeout(ctx, closeTimeout)
		if err := chromedp.Cancel(cctx); err != nil && !errors.Is(err, context.Canceled) {
			t.Logf("browser: closing %s: %v", path, err)
		}
		ccancel()
		cancel()
		cancelAlloc()
		log.close()
		if n := killProcessesUsing(dir); n > 0 {
			t.Logf("browser: killed %d processes of %s left after it closed", n, path)
		}
	})
	// The first Do binds the browser's life to ctx, so it must not carry a
	// deadline; the watchdog cancels it instead if the launch hangs.
	if err := withWatchdog(cancel, startTimeout, func() error { return chromedp.Do(ctx) }); err != nil {
		t.Fatalf("browser: starting %s: %v", path, err)
	}
	return &Browser{ctx: ctx, path: path, dir: dir}
}

// viewportWidth and viewportHeight size each Session's page, so that
// layouts and screenshots are those of a desktop window, not of headless
// Chromium's default 780×493 one.
const viewportWidth, viewportHeight = 1280, 800

// NewSession opens a tab in a new browser context of b: cookies, storage and
// cache are its own and shared with no other Session. Its viewport is
// 1280×800. The tab is closed and its browser context disposed of when t
// ends. It fails t when the tab does not open within 30 s. The Session's
// actions report failures to t, so use it from t's goroutine.
func (b *Browser) NewSession(t testing.TB) *Session {
	t.Helper()
	ctx, cancel := chromedp.NewContext(b.ctx, chromedp.WithNewBrowserContext())
	t.Cleanup(cancel)
	open := func() error { return chromedp.Do(ctx, chromedp.EmulateViewport(viewportWidth, viewportHeight)) }
	if err := withWatchdog(cancel, startTimeout, open); err != nil {
		t.Fatalf("browser: opening a session in %s: %v", b.path, err)
	}
	return &Session{t: t, ctx: ctx, url: "about:blank"}
}

// withWatchdog runs f and cancels its context with cancel if f has not
// returned after d.
func withWatchdog(cancel context.CancelFunc, d time.Duration, f func() error) error {
	timer := time.AfterFunc(d, cancel)
	err := f()
	if !timer.Stop() {
		if err == nil {
			err = context.Canceled
		}
		return fmt.Errorf("gave up after %s: %w", d, err)
	}
	return err
}

// findChromium returns the executable Start runs: $JOBFENCE_CHROMIUM, else
// chromium or chromium-browser on PATH, else /usr/bin/chromium. The error
// says how to install it.
func findChromium() (string, error) {
	if p := os.Getenv(EnvChromium); p != "" {
		found, err := exec.LookPath(p)
		if err != nil {
			return "", fmt.Errorf("browser: %s=%s: %v", EnvChromium, p, err)
		}
		return found, nil
	}
	for _, name := range []string{"chromium", "chromium-browser", "/usr/bin/chromium"} {
		if found, err := exec.LookPath(name); err == nil {
			return found, nil
		}
	}
	return "", errors.New("browser: no Chromium found (looked for chromium and chromium-browser on PATH, " +
		"and /usr/bin/chromium): the end-to-end tests need a real browser; install Debian's chromium " +
		"package (apt-get install chromium) or set " + EnvChromium + " to a Chromium executable")
}

// killProcessesUsing kills, until none is left, the processes that run
// with the profile dir, and returns how many it killed. The allocator
// removes leftovers only of profiles it made itself, and a browser killed
// after a failed close can leave its zygote and renderers running.
func killProcessesUsing(dir string) int {
	killed := 0
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		pids := processesUsing(dir)
		if len(pids) == 0 {
			break
		}
		for _, pid := range pids {
			if syscall.Kill(pid, syscall.SIGKILL) == nil {
				killed++
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return killed
}

// processesUsing lists the live processes whose command line names the
// profile dir: Chromium passes --user-data-dir to every child it starts
// (the crash handler aside, which exits with the browser). Where /proc
// cannot be read it finds none.
func processesUsing(dir string) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	want := "--user-data-dir=" + dir
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil {
			continue
		}
		if slices.Contains(strings.Split(string(cmdline), "\x00"), want) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// testLog passes chromedp's log lines to the test while it runs, and drops
// those that arrive after cleanup (t.Logf panics once a test has ended).
type testLog struct {
	mu     sync.Mutex
	t      testing.TB
	closed bool
}

func (l *testLog) logf(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.closed {
		l.t.Logf("chromedp: "+format, args...)
	}
}

func (l *testLog) errorf(format string, args ...any) { l.logf("ERROR: "+format, args...) }

func (l *testLog) close() {
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
}
