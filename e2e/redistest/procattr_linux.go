package redistest

import "syscall"

// procAttr makes the kernel kill redis-server when the test binary dies
// without running its cleanups (a timeout panic, say), so no server is left
// behind.
func procAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
