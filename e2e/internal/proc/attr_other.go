//go:build !linux

package proc

import "syscall"

// SysProcAttr has nothing to add outside Linux: the helpers' cleanups stop
// their children.
func SysProcAttr() *syscall.SysProcAttr { return nil }
