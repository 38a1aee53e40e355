package console

import (
	"errors"
	"net/url"
	"strings"
)

// traceIDPlaceholder is what Options.TraceLinkTemplate's trace id replaces.
const traceIDPlaceholder = "{trace_id}"

// CheckTraceLinkTemplate reports what is wrong with a trace link template
// (Options.TraceLinkTemplate); nil for a good one or none.
func CheckTraceLinkTemplate(tmpl string) error {
	if tmpl == "" {
		return nil
	}
	if !strings.Contains(tmpl, traceIDPlaceholder) {
		return errors.New("must contain " + traceIDPlaceholder + ", e.g. https://jaeger.example/trace/{trace_id}")
	}
	u, err := url.Parse(strings.ReplaceAll(tmpl, traceIDPlaceholder, "0af7651916cd43dd8448eb211c80319c"))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return errors.New("must be an http or https URL with a host, e.g. https://jaeger.example/trace/{trace_id}")
	}
	return nil
}

// traceLink is the trace id of a job's stored traceparent (R35) and its
// link by tmpl (empty without one); both empty when the traceparent is not
// a W3C traceparent of version 00.
func traceLink(traceparent, tmpl string) (id, link string) {
	parts := strings.Split(traceparent, "-")
	if len(parts) != 4 || parts[0] != "00" || len(parts[1]) != 32 || strings.Trim(parts[1], "0123456789abcdef") != "" ||
		strings.Trim(parts[1], "0") == "" {
		return "", ""
	}
	id = parts[1]
	if tmpl != "" {
		link = strings.ReplaceAll(tmpl, traceIDPlaceholder, id)
	}
	return id, link
}
