//go:build !linux

package broker

import "syscall"

// deferAccept does nothing where the kernel has no TCP_DEFER_ACCEPT: a connection is looked at when it is
// accepted, whether its first bytes came or not.
func deferAccept(string, string, syscall.RawConn) error { return nil }
