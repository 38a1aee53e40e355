package main

import (
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// clockTicks is USER_HZ, the unit of utime and stime in /proc/<pid>/stat; it
// is 100 on every Linux architecture Go supports.
const clockTicks = 100

// procCPU is a process's user+system CPU time so far.
func procCPU(pid int) (time.Duration, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name may contain spaces; the fields start after its ')'.
	i := strings.LastIndexByte(string(data), ')')
	if i < 0 {
		return 0, errors.New("unexpected /proc stat format")
	}
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 13 {
		return 0, errors.New("unexpected /proc stat format")
	}
	// Fields 14 and 15 of stat (utime, stime) are 12 and 13 after the name.
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	return time.Duration(utime+stime) * time.Second / clockTicks, nil
}

// cpuMeter gives the share of one core a process used between two readings.
type cpuMeter struct {
	pid     int
	cpu, at time.Duration // the last reading, and its soak clock
}

// share reads pid's CPU time at the soak clock's now and returns the share
// of one core it used since the previous reading; NaN at the first reading
// of a process (a restarted coordinator is another one) or when it cannot
// be read.
func (m *cpuMeter) share(pid int, now time.Duration) float64 {
	cpu, err := procCPU(pid)
	if pid == 0 || err != nil {
		m.pid = 0
		return math.NaN()
	}
	prev := *m
	m.pid, m.cpu, m.at = pid, cpu, now
	if prev.pid != pid || now <= prev.at {
		return math.NaN()
	}
	return float64(cpu-prev.cpu) / float64(now-prev.at)
}

// selfCPU is this process's user+system CPU time so far: the producer's and
// the workers'.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
