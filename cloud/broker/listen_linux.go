package broker

import (
	"errors"
	"syscall"
)

// deferAcceptSeconds is how long the kernel holds a connection whose client has sent nothing yet before it hands
// it to the broker anyway (where its handshake or CONNECT deadline then runs).
const deferAcceptSeconds = 1

// deferAccept makes the kernel hand the listener a connection only once its client has sent its first bytes: MQTT
// and TLS clients speak first, and an agent builds its ClientHello (key shares and all) only after its connect
// returned, which on a small or loaded node takes milliseconds, while its kernel acknowledged the connection at
// once. Accepted on that acknowledgement, the connection would be looked at before its hello came (no ticket seen,
// so not vouched for) and, under a churn from its address, closed within milliseconds.
func deferAccept(_, _ string, c syscall.RawConn) error {
	var set error
	err := c.Control(func(fd uintptr) {
		set = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_DEFER_ACCEPT, deferAcceptSeconds)
	})
	return errors.Join(err, set)
}
