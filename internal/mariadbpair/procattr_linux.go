package mariadbpair

import "syscall"

// childProcAttr has the kernel SIGKILL a server when the test process dies
// without calling Close (a test timeout's panic, a kill): an orphaned
// mariadbd would keep its port and make a later `pgrep mariadbd` lie.
func childProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
