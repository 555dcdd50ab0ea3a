//go:build unix

package broker

import (
	"net"
	"syscall"
)

// peek copies into buf what conn's peer has sent already, without consuming it or waiting: 0 when nothing has
// come yet, or conn is not a socket.
func peek(conn net.Conn, buf []byte) int {
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return 0
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return 0
	}
	n := 0
	_ = raw.Read(func(fd uintptr) bool {
		if m, _, err := syscall.Recvfrom(int(fd), buf, syscall.MSG_PEEK|syscall.MSG_DONTWAIT); err == nil && m > 0 {
			n = m
		}
		return true // never wait
	})
	return n
}
