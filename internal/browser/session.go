package browser

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	cdplog "github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
)

// Session is one tab in a browser context of its own, as one person at one
// browser. Selectors are CSS selectors (document.querySelector). Every
// action waits at most ActionTimeout and, when it fails, fails the Session's
// test with t.Fatal and a message naming the action, the selector and the
// page's URL; Run returns the error instead. A Session is not safe for
// concurrent use: call it from the goroutine of the test that made it.
type Session struct {
	t   testing.TB
	ctx context.Context
	// url and status are those of the document the last Navigate, Click,
	// Submit or PostForm loaded: the final response, after redirects.
	url    string
	status int
}

// Navigate loads rawURL and waits for its load event. The response's status
// is then Status (an HTTP error status is not a failure). It fails the test
// when the page cannot be loaded (no server, a bad URL) or does not finish
// loading in time.
func (s *Session) Navigate(rawURL string) {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(s.ctx, ActionTimeout)
	defer cancel()
	resp, err := chromedp.Run(ctx, chromedp.NavigateResponse(rawURL))
	if err != nil {
		// The tab now shows Chromium's error page, so name the page we
		// came from rather than the tab's URL.
		s.t.Fatalf("browser: navigate from %s to %s: %v", s.url, rawURL, s.explain("", err))
	}
	s.loaded(resp, rawURL)
}

// Click clicks the first element matching selector with the mouse, as a
// person does, and waits for the page load that the click starts. It fails
// the test when no visible element matches or no page loads in time; for a
// click that loads no page, use Run(chromedp.Click(chromedp.CSS(selector))).
func (s *Session) Click(selector string) {
	s.t.Helper()
	s.waitLoad("click", selector, chromedp.Click(chromedp.CSS(selector)))
}

// Submit submits the form of the first element matching selector (a form,
// or an element inside one) with form.requestSubmit, as pressing Enter in it
// does: the form's validation and submit event run, and a submit button
// given as selector is sent as the submitter. It waits for the page load
// that follows, and fails the test when no element matches, the element is
// in no form, or no page loads in time (a form its validation stops loads
// none).
func (s *Session) Submit(selector string) {
	s.t.Helper()
	s.waitLoad("submit", selector, chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		if _, err := chromedp.WaitReady(chromedp.CSS(selector))(ctx, t); err != nil {
			return err
		}
		ok, err := chromedp.Evaluate[bool](fmt.Sprintf(submitJS, jsString(selector)))(ctx, t)
		if err == nil && !ok {
			err = errors.New("the element is not in a form")
		}
		return err
	}))
}

// submitJS submits the form of the element %s names; it returns false when
// the element is neither a form nor in one.
const submitJS = `(() => {
	const el = document.querySelector(%s);
	if (el instanceof HTMLFormElement) { el.requestSubmit(); return true; }
	if (!el || !el.form) { return false; }
	if (el.type === "submit" || el.type === "image") { el.form.requestSubmit(el); } else { el.form.requestSubmit(); }
	return true;
})()`

// PostForm submits a form that the test composes — method POST, the given
// action (resolved against the current page's URL) and exactly fields,
// url-encoded in the order of their names — from the current page, as the page's own form would be,
// cookies included. It is how a test sends what no honest page would: a
// POST without its CSRF token, or with another session's. It waits for the
// response's page to load (read Status for its code) and fails the test
// when none loads in time.
func (s *Session) PostForm(action string, fields url.Values) {
	s.t.Helper()
	type field struct{ Name, Value string }
	var list []field
	for _, name := range slices.Sorted(maps.Keys(fields)) {
		for _, v := range fields[name] {
			list = append(list, field{name, v})
		}
	}
	js := fmt.Sprintf(postFormJS, jsString(action), jsValue(list))
	s.waitLoad("post a crafted form to "+action, "", chromedp.Evaluate[chromedp.Void](js))
}

// postFormJS builds and submits a form with action %s and the fields %s;
// form.submit, unlike requestSubmit, skips validation and submit handlers.
const postFormJS = `(() => {
	const form = document.createElement("form");
	form.method = "POST";
	form.action = %s;
	for (const f of %s) {
		const input = document.createElement("input");
		input.type = "hidden";
		input.name = f.Name;
		input.value = f.Value;
		form.appendChild(input);
	}
	(document.body || document.documentElement).appendChild(form);
	form.submit();
})()`

// FormValues returns what the form of the first element matching selector
// (a form, or an element inside one) would send now, hidden fields such as
// a CSRF token included and submit buttons left out. A test edits the
// result and sends it with PostForm. It fails the test when no element
// matches in time or the element is in no form.
func (s *Session) FormValues(selector string) url.Values {
	s.t.Helper()
	list := run(s, "read the form", selector, func(ctx context.Context, t *chromedp.Target) ([][2]string, error) {
		if _, err := chromedp.WaitReady(chromedp.CSS(selector))(ctx, t); err != nil {
			return nil, err
		}
		return chromedp.Evaluate[[][2]string](fmt.Sprintf(formValuesJS, jsString(selector)))(ctx, t)
	})
	if list == nil {
		s.fail("read the form", selector, errors.New("the element is not in a form"))
	}
	values := url.Values{}
	for _, p := range list {
		values.Add(p[0], p[1])
	}
	return values
}

// formValuesJS lists the [name, value] pairs of the form of the element %s
// names, or gives null when there is no such form; a file field gives its
// file's name.
const formValuesJS = `(() => {
	const el = document.querySelector(%s);
	const form = el instanceof HTMLFormElement ? el : el && el.form;
	if (!form) { return null; }
	return [...new FormData(form)].map(([k, v]) => [k, typeof v === "string" ? v : v.name]);
})()`

// Fill sets the value of the first input, textarea or select matching
// selector to value, replacing what was there. It sets the value property
// without key events, which is all a page without JavaScript sees. It fails
// the test when no element matches in time.
func (s *Session) Fill(selector, value string) {
	s.t.Helper()
	run(s, "fill", selector, chromedp.SetValue(chromedp.CSS(selector), value))
}

// Text returns the rendered text (innerText) of the first element matching
// selector, waiting for one to exist; an element that is not displayed
// gives "". It fails the test when no element matches in time.
func (s *Session) Text(selector string) string {
	s.t.Helper()
	return run(s, "read the text of", selector, chromedp.Text(chromedp.CSS(selector)))
}

// Value returns the current value property of the first input, textarea or
// select matching selector. It fails the test when no element matches in
// time.
func (s *Session) Value(selector string) string {
	s.t.Helper()
	return run(s, "read the value of", selector, chromedp.Value(chromedp.CSS(selector)))
}

// Exists reports whether an element matches selector now, without waiting.
// It fails the test when selector is not valid CSS.
func (s *Session) Exists(selector string) bool {
	s.t.Helper()
	return run(s, "look for", selector, chromedp.Evaluate[bool](fmt.Sprintf(existsJS, jsString(selector))))
}

// existsJS is true when an element matches the selector %s.
const existsJS = `document.querySelector(%s) !== null`

// HTML returns the current document's markup (document.documentElement's
// outerHTML, as the DOM has it now).
func (s *Session) HTML() string {
	s.t.Helper()
	return run(s, "read the page's HTML", "", chromedp.Evaluate[string](`document.documentElement.outerHTML`))
}

// CurrentURL returns the URL of the current document.
func (s *Session) CurrentURL() string {
	s.t.Helper()
	return run(s, "read the URL", "", chromedp.Location())
}

// Status returns the HTTP status of the document the last Navigate, Click,
// Submit or PostForm loaded: the final response, after any redirects (a
// POST answered 303 then 200 gives 200). It is 0 before the first load and
// after a load that had no HTTP response (a fragment link).
func (s *Session) Status() int { return s.status }

// Cookies returns the cookies the Session's browser context would send to
// the current page, with their attributes (HttpOnly, SameSite, Secure). No
// other Session sees them.
func (s *Session) Cookies() []*network.Cookie {
	s.t.Helper()
	return run(s, "read the cookies", "", func(ctx context.Context, t *chromedp.Target) ([]*network.Cookie, error) {
		res, err := cdp.Call(ctx, t, network.GetCookies, network.GetCookiesParams{})
		return res.Cookies, err
	})
}

// Screenshot writes a PNG of the whole page, beyond the viewport, to path.
// It fails the test when the capture or the write fails.
func (s *Session) Screenshot(path string) {
	s.t.Helper()
	png := run(s, "take a screenshot", "", chromedp.FullScreenshot(100))
	if err := os.WriteFile(path, png, 0o644); err != nil {
		s.fail("save a screenshot", "", err)
	}
}

// Run runs chromedp actions in the Session's tab, in order, within one
// ActionTimeout, and returns the first error, wrapped with the page's URL;
// it does not fail the test. A Navigate, Click or Submit run this way does
// not update Status.
func (s *Session) Run(actions ...chromedp.Action[chromedp.Void]) error {
	ctx, cancel := context.WithTimeout(s.ctx, ActionTimeout)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		return s.describe("run actions", "", err)
	}
	return nil
}

// waitLoad runs trigger and waits for the page load it starts, recording
// the response.
func (s *Session) waitLoad(what, selector string, trigger chromedp.Action[chromedp.Void]) {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(s.ctx, ActionTimeout)
	defer cancel()
	triggered := false
	resp, err := chromedp.RunResponse(ctx, func(ctx context.Context, t *chromedp.Target) (chromedp.Void, error) {
		v, err := trigger(ctx, t)
		triggered = err == nil
		return v, err
	})
	if triggered && errors.Is(err, context.DeadlineExceeded) {
		err = &noLoadError{err}
	}
	if err != nil {
		s.fail(what, selector, err)
	}
	s.loaded(resp, "")
}

// noLoadError is a timeout of an action that did its part (a click, a
// submit) but after which no page loaded.
type noLoadError struct{ err error }

func (e *noLoadError) Error() string {
	return fmt.Sprintf("no page loaded within %s (for an action that loads none, use Run)", ActionTimeout)
}

func (e *noLoadError) Unwrap() error { return e.err }

// loaded records the document a navigation loaded; fallback is its URL when
// there was no HTTP response to read it from.
func (s *Session) loaded(resp *network.Response, fallback string) {
	s.status = 0
	if resp != nil {
		s.status = int(resp.Status)
		fallback = resp.URL
	}
	if fallback != "" {
		s.url = fallback
	}
}

// run runs a within ActionTimeout and returns its value, failing s's test
// with what was being done when it errs.
func run[T any](s *Session, what, selector string, a chromedp.Action[T]) T {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(s.ctx, ActionTimeout)
	defer cancel()
	v, err := chromedp.Run(ctx, a)
	if err != nil {
		s.fail(what, selector, err)
	}
	return v
}

// fail fails s's test with err described.
func (s *Session) fail(what, selector string, err error) {
	s.t.Helper()
	s.t.Fatal(s.describe(what, selector, err))
}

// describe wraps err with the action, its selector and the page's URL.
func (s *Session) describe(what, selector string, err error) error {
	if selector != "" {
		what = fmt.Sprintf("%s %q", what, selector)
	}
	return fmt.Errorf("browser: %s on %s: %w", what, s.pageURL(), s.explain(selector, err))
}

// explain says why an action timed out, when its error says only that: no
// page loaded after it, no element matches selector, or just the timeout.
func (s *Session) explain(selector string, err error) error {
	var noLoad *noLoadError
	switch {
	case errors.As(err, &noLoad) || !errors.Is(err, context.DeadlineExceeded):
		return err
	case selector != "" && !s.matches(selector):
		return fmt.Errorf("no element matches %q (waited %s): %w", selector, ActionTimeout, err)
	default:
		return fmt.Errorf("timed out after %s: %w", ActionTimeout, err)
	}
}

// pageURL asks the tab for its URL, briefly, for an error message; it falls
// back to the last URL a navigation recorded.
func (s *Session) pageURL() string {
	ctx, cancel := context.WithTimeout(s.ctx, 2*time.Second)
	defer cancel()
	if u, err := chromedp.Run(ctx, chromedp.Location()); err == nil {
		return u
	}
	return s.url
}

// matches reports whether selector matches an element now, briefly, for an
// error message.
func (s *Session) matches(selector string) bool {
	ctx, cancel := context.WithTimeout(s.ctx, 2*time.Second)
	defer cancel()
	ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool](fmt.Sprintf(existsJS, jsString(selector))))
	return err == nil && ok
}

// jsString returns s as a JavaScript string literal.
func jsString(s string) string { return jsValue(s) }

// jsValue returns v as a JavaScript literal (JSON is valid JavaScript, and
// encoding/json escapes U+2028 and U+2029).
func jsValue(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("browser: encoding %T for JavaScript: %v", v, err))
	}
	return string(b)
}

// WatchLog starts collecting the messages of level error the browser logs
// for the Session's pages from now on — a Content-Security-Policy
// violation, a resource that failed to load — and returns a func that
// reports those seen so far, one line each. It fails the test when the log
// cannot be watched.
func (s *Session) WatchLog() func() []string {
	s.t.Helper()
	var mu sync.Mutex
	var seen []string
	if err := chromedp.Listen(s.ctx, func(ev any) {
		if e, ok := ev.(*cdplog.EventEntryAdded); ok && e.Entry != nil && e.Entry.Level == cdplog.EntryLevelError {
			mu.Lock()
			seen = append(seen, fmt.Sprintf("%s: %s (%s)", e.Entry.Source, e.Entry.Text, e.Entry.URL))
			mu.Unlock()
		}
	}); err != nil {
		s.fail("watch the log", "", err)
	}
	run(s, "watch the log", "", func(ctx context.Context, t *chromedp.Target) (cdp.Empty, error) {
		return cdp.Call(ctx, t, cdplog.Enable, cdp.Empty{})
	})
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(seen)
	}
}
