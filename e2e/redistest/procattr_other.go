//go:build !linux

package redistest

import "syscall"

// procAttr has nothing to add outside Linux: cleanups stop the server.
func procAttr() *syscall.SysProcAttr { return nil }
