//go:build !linux

package e2eproc

import "syscall"

func procAttr() *syscall.SysProcAttr { return nil }
