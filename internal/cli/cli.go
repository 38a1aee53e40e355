// Package cli is what every jobfence command shares around its own flags:
// the signal-aware main, flag parsing with environment fallbacks, and the
// --log-format/--log-level pair.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jobfence/jobfence/internal/flagenv"
)

// Main runs a command's run with a context cancelled on SIGINT or SIGTERM.
// -h exits 0; an error is printed as "name: error" and exits 1.
func Main(name string, run func(ctx context.Context) error) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx)
	stop()
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, name+":", err)
		os.Exit(1)
	}
}

// Parse parses args into fs, refuses positional arguments, and fills every
// flag not given from PREFIX_<FLAG> (flagenv). -h prints the usage; a bad
// flag is one line naming it, the value and what would do (not the whole
// usage).
func Parse(fs *flag.FlagSet, args []string, envPrefix string) error {
	out := fs.Output()
	var usage strings.Builder
	fs.SetOutput(&usage)
	err := fs.Parse(args)
	fs.SetOutput(out)
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(out, usage.String())
		return err
	}
	if err != nil {
		return fmt.Errorf("%s (run with -h for every flag)", hint(fs, err))
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	return flagenv.Apply(fs, envPrefix)
}

// hint rewrites the flag package's "invalid value "30" for flag -lease:
// parse error" as "--lease 30: a duration needs a unit, e.g. 30s or 2m".
func hint(fs *flag.FlagSet, err error) string {
	var value, name string
	if _, scanErr := fmt.Sscanf(err.Error(), "invalid value %q for flag -%s", &value, &name); scanErr != nil {
		return err.Error()
	}
	name = strings.TrimSuffix(name, ":")
	f := fs.Lookup(name)
	if f == nil {
		return err.Error()
	}
	if g, ok := f.Value.(flag.Getter); ok && isDuration(g.Get()) {
		return fmt.Sprintf("--%s %q: a duration needs a unit, e.g. %s (s, m, h; ms for milliseconds)", name, value, f.DefValue)
	}
	return fmt.Sprintf("--%s %q: %s", name, value, strings.TrimPrefix(err.Error(), fmt.Sprintf("invalid value %q for flag -%s: ", value, name)))
}

func isDuration(v any) bool {
	_, ok := v.(time.Duration)
	return ok
}

// CheckListen reports a listen address that is not host:port, saying which
// half is missing ("localhost" has no port, "50051" no host).
func CheckListen(flagName, addr string) error {
	_, port, err := net.SplitHostPort(addr)
	switch {
	case err != nil && !strings.Contains(addr, ":") && strings.Trim(addr, "0123456789") == "":
		return fmt.Errorf("--%s %q has no host: want host:port, e.g. 127.0.0.1:%s (or 0.0.0.0:%[3]s for every interface)",
			flagName, addr, addr)
	case err != nil:
		return fmt.Errorf("--%s %q has no port: want host:port, e.g. %s:50051", flagName, addr, strings.Trim(addr, "[]:"))
	}
	if n, perr := strconv.Atoi(port); perr != nil || n < 0 || n > 65535 {
		return fmt.Errorf("--%s %q: the port must be a number from 0 to 65535", flagName, addr)
	}
	return nil
}

// Log is the --log-format and --log-level pair.
type Log struct {
	format string
	level  slog.Level
}

// Register adds the two flags to fs.
func (l *Log) Register(fs *flag.FlagSet) {
	fs.StringVar(&l.format, "log-format", "text", "log format: text or json")
	fs.TextVar(&l.level, "log-level", slog.LevelInfo, "log level: debug, info, warn or error")
}

// Validate reports a bad --log-format.
func (l *Log) Validate() error {
	if l.format != "text" && l.format != "json" {
		return fmt.Errorf("--log-format must be text or json, got %q", l.format)
	}
	return nil
}

// New returns the logger the flags describe, writing to w.
func (l *Log) New(w io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: l.level}
	if l.format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// IsLoopback reports whether a host:port address stays on this machine.
func IsLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
