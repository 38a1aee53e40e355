package console

import (
	"fmt"
	"html/template"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/jobfence/jobfence/gen/jobfence/v1"
)

// funcs are the templates' formatting helpers. Times are shown in UTC, the
// database's clock (R12).
var funcs = template.FuncMap{
	"ts":      formatTime,
	"age":     age,
	"since":   since,
	"amount":  amount,
	"state":   func(s pb.JobState) string { return enumWord(s.String(), "JOB_STATE_") },
	"action":  func(a pb.NextAction) string { return enumWord(a.String(), "NEXT_ACTION_") },
	"outcome": func(o pb.ObservationOutcome) string { return enumWord(o.String(), "OBSERVATION_OUTCOME_") },
	"stateClass": func(s pb.JobState) string {
		return strings.ReplaceAll(enumWord(s.String(), "JOB_STATE_"), " ", "-")
	},
	"stale":        isLate,
	"plain":        plain,
	"count":        func(m map[int64]int64, id int64) int64 { return m[id] },
	"searchFields": func() []string { return searchFields },
	"clock":        func(t time.Time) string { return t.UTC().Format(timeLayout) },
	"exact": func(t *timestamppb.Timestamp) string {
		return t.AsTime().UTC().Format(time.RFC3339Nano)
	},
	"attention": attentionWords,
	"finished":  finished,
}

func enumWord(name, prefix string) string {
	return strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(name, prefix)), "_", " ")
}

func formatTime(t *timestamppb.Timestamp) string {
	if t == nil {
		return "—"
	}
	return t.AsTime().UTC().Format("2006-01-02 15:04:05Z")
}

// age is how long before now t was, e.g. "3h12m"; "—" when unset.
func age(t, now *timestamppb.Timestamp) string {
	if t == nil || now == nil {
		return "—"
	}
	return short(now.AsTime().Sub(t.AsTime()))
}

// since is age on the console's own clock, for lists the API answers without
// a time of its own. Only shown, never decided on.
func since(t *timestamppb.Timestamp) string {
	if t == nil {
		return "—"
	}
	return short(time.Since(t.AsTime()))
}

// short writes d in its two largest units: 2d3h, 3h12m, 4m10s, 12s.
func short(d time.Duration) string {
	neg := d < 0
	if neg {
		d = -d
	}
	var s string
	switch {
	case d >= 48*time.Hour:
		s = fmt.Sprintf("%dd%dh", d/(24*time.Hour), d%(24*time.Hour)/time.Hour)
	case d >= time.Hour:
		s = fmt.Sprintf("%dh%dm", d/time.Hour, d%time.Hour/time.Minute)
	case d >= time.Minute:
		s = fmt.Sprintf("%dm%ds", d/time.Minute, d%time.Minute/time.Second)
	default:
		s = fmt.Sprintf("%ds", d/time.Second)
	}
	if neg {
		return "in " + s
	}
	return s
}

// minorDigits lists the ISO 4217 currencies whose minor unit is not a
// hundredth.
var minorDigits = map[string]int{
	"BIF": 0, "CLP": 0, "DJF": 0, "GNF": 0, "ISK": 0, "JPY": 0, "KMF": 0, "KRW": 0, "PYG": 0, "RWF": 0,
	"UGX": 0, "UYI": 0, "VND": 0, "VUV": 0, "XAF": 0, "XOF": 0, "XPF": 0,
	"BHD": 3, "IQD": 3, "JOD": 3, "KWD": 3, "LYD": 3, "OMR": 3, "TND": 3, "CLF": 4, "UYW": 4,
}

// amount writes an amount in minor units in its currency: 1234 EUR is
// "12.34 EUR", 500 JPY is "500 JPY".
func amount(minor int64, currency string) string {
	digits, ok := minorDigits[currency]
	if !ok {
		digits = 2
	}
	sign := ""
	if minor < 0 {
		sign, minor = "-", -minor
	}
	s := strconv.FormatInt(minor, 10)
	if digits > 0 {
		if len(s) <= digits {
			s = strings.Repeat("0", digits-len(s)+1) + s
		}
		s = s[:len(s)-digits] + "." + s[len(s)-digits:]
	}
	return sign + s + " " + currency
}
