package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat's CPU times: 100 on
// every Linux architecture Go runs on.
const clockTicks = 100

// procStat is the part of /proc/<pid>/stat the meter reads.
type procStat struct {
	comm           string
	ppid           int
	utime, stime   int64 // this process's own CPU, in clock ticks
	cutime, cstime int64 // its children that it has waited for, in clock ticks
}

// parseProcStat parses the contents of /proc/<pid>/stat. The command name is
// in parentheses and may itself contain spaces and parentheses, so the fields
// are counted from its last ')'.
func parseProcStat(data string) (procStat, error) {
	var s procStat
	open, end := strings.IndexByte(data, '('), strings.LastIndexByte(data, ')')
	if open < 0 || end < open {
		return s, errors.New("unexpected /proc stat format: no command name")
	}
	s.comm = data[open+1 : end]
	f := strings.Fields(data[end+1:])
	// After the name: state(3) ppid(4) … utime(14) stime(15) cutime(16) cstime(17).
	if len(f) < 15 {
		return s, fmt.Errorf("unexpected /proc stat format: %d fields after the name", len(f))
	}
	var errs [5]error
	s.ppid, errs[0] = strconv.Atoi(f[1])
	s.utime, errs[1] = strconv.ParseInt(f[11], 10, 64)
	s.stime, errs[2] = strconv.ParseInt(f[12], 10, 64)
	s.cutime, errs[3] = strconv.ParseInt(f[13], 10, 64)
	s.cstime, errs[4] = strconv.ParseInt(f[14], 10, 64)
	if err := errors.Join(errs[:]...); err != nil {
		return s, fmt.Errorf("unexpected /proc stat format: %w", err)
	}
	return s, nil
}

func readProcStat(pid int) (procStat, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procStat{}, err
	}
	return parseProcStat(string(data))
}

func ticks(n int64) time.Duration { return time.Duration(n) * time.Second / clockTicks }

// serverCPU is the CPU time PostgreSQL has used so far: the postmaster's own,
// that of its children which have exited (the postmaster waits for every
// backend, so their time lands in its cutime and cstime), and that of its
// living children (backends, the checkpointer, the WAL writer, …). A backend
// alive at one reading and gone at the next is counted once either way.
func serverCPU(postmaster int) (time.Duration, error) {
	pm, err := readProcStat(postmaster)
	if err != nil {
		return 0, err
	}
	total := pm.utime + pm.stime + pm.cutime + pm.cstime
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == postmaster {
			continue
		}
		s, err := readProcStat(pid)
		if err != nil || s.ppid != postmaster {
			continue // gone meanwhile, or not PostgreSQL's
		}
		total += s.utime + s.stime
	}
	return ticks(total), nil
}

// namedCPU is the CPU time of every process whose command name is name, the
// last resort when the postmaster cannot be found: it counts every cluster on
// the machine, and loses the time of processes that exit between readings.
func namedCPU(name string) (time.Duration, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	var total int64
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if s, err := readProcStat(pid); err == nil && s.comm == name {
			total += s.utime + s.stime
		}
	}
	return ticks(total), nil
}

// selfCPU is this process's user and system CPU time so far: the River
// client, its workers and the producer alike.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// serverMeter reads PostgreSQL's CPU time by one of three means, the first
// that works: the parent of this session's backend, the pid in the data
// directory's postmaster.pid, or every process named postgres.
type serverMeter struct {
	postmaster int    // 0: count processes by name
	how        string // how the server's processes were found, for the summary
	ok         bool   // false: the server is not on this machine, or not readable
}

// findServer locates the PostgreSQL server that pool is connected to.
func findServer(ctx context.Context, pool *pgxpool.Pool) serverMeter {
	var backend int
	if err := pool.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&backend); err == nil {
		if s, err := readProcStat(backend); err == nil && isPostgres(s.ppid) {
			return serverMeter{postmaster: s.ppid, how: "backend_parent", ok: true}
		}
	}
	var dataDir string
	if err := pool.QueryRow(ctx, "SHOW data_directory").Scan(&dataDir); err == nil {
		if data, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid")); err == nil {
			first, _, _ := strings.Cut(string(data), "\n")
			if pid, err := strconv.Atoi(strings.TrimSpace(first)); err == nil && isPostgres(pid) {
				return serverMeter{postmaster: pid, how: "postmaster_pid", ok: true}
			}
		}
	}
	if cpu, err := namedCPU("postgres"); err == nil && cpu > 0 {
		return serverMeter{how: "process_name", ok: true}
	}
	return serverMeter{how: "none"}
}

func isPostgres(pid int) bool {
	s, err := readProcStat(pid)
	return err == nil && (s.comm == "postgres" || s.comm == "postmaster")
}

// read returns PostgreSQL's CPU time so far.
func (m serverMeter) read() (time.Duration, error) {
	switch {
	case !m.ok:
		return 0, errors.New("the PostgreSQL server's processes were not found on this machine")
	case m.postmaster != 0:
		return serverCPU(m.postmaster)
	default:
		return namedCPU("postgres")
	}
}

// cpuSample is one reading of the server's and this process's CPU time.
type cpuSample struct {
	server   time.Duration
	serverOK bool
	client   time.Duration
}

func (m serverMeter) sample() cpuSample {
	s := cpuSample{client: selfCPU()}
	if cpu, err := m.read(); err == nil {
		s.server, s.serverOK = cpu, true
	}
	return s
}

// cpuPerJob is the CPU microseconds per job between two samples: the
// server's (NaN when it could not be read), the client's, and their sum.
func cpuPerJob(before, after cpuSample, jobs int) (server, client, total float64) {
	client = ratio(float64((after.client - before.client).Microseconds()), float64(jobs))
	server = ratio(0, 0)
	if before.serverOK && after.serverOK {
		server = ratio(float64((after.server - before.server).Microseconds()), float64(jobs))
	}
	return server, client, server + client
}
