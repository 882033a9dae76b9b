package proc

import "syscall"

// SysProcAttr returns the attributes to start a child with: the kernel
// kills the child (SIGKILL) when the test binary dies without running its
// cleanups (a timeout panic, say), so no process is left behind.
//
// Pdeathsig fires when the OS thread that started the child exits; Go's
// runtime does not end its threads unless a goroutine locked to one exits,
// which the e2e helpers do not do.
func SysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
