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
	"syscall"

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
// flag not given from PREFIX_<FLAG> (flagenv).
func Parse(fs *flag.FlagSet, args []string, envPrefix string) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	return flagenv.Apply(fs, envPrefix)
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
