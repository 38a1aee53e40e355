//go:build !linux

package mariadbpair

import "syscall"

// childProcAttr is the default elsewhere: only Linux offers a parent-death
// signal, so a server outlives a test process that dies without Close.
func childProcAttr() *syscall.SysProcAttr { return nil }
