// Package listen binds the agent's node-local ports so that no other process of the node can take them: the
// report API, which workers reach as `localhost`, on every loopback address that name resolves to (Addresses), and
// each port again and again while another process holds it, instead of exiting (which would only crash-loop the
// agent and leave the port to the other process).
package listen

import (
	"context"
	"errors"
	"fmt"
	"net"
	"syscall"
	"time"

	"github.com/go-logr/logr"

	"github.com/lifeline-edge/lifeline/internal/lograte"
)

// Retry is how long a listener waits before it tries a held address again.
var Retry = 2 * time.Second

// Addresses is what addr is served on: a loopback address (127.0.0.1, ::1 or localhost) becomes both 127.0.0.1
// and ::1 on its port, for `localhost` resolves to ::1 first on Debian and RHEL-family nodes, and a client trying
// ::1 first reaches whichever process holds that port there; any other address is itself.
func Addresses(addr string) ([]string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("address %q: %w", addr, err)
	}
	ip := net.ParseIP(host)
	if host == "localhost" || ip != nil && (ip.Equal(net.IPv4(127, 0, 0, 1)) || ip.Equal(net.IPv6loopback)) {
		return []string{net.JoinHostPort("127.0.0.1", port), net.JoinHostPort("::1", port)}, nil
	}
	return []string{addr}, nil
}

// WhenFree listens on addr, trying again every Retry while another process holds it, until it gets it or ctx
// ends (nil then). A node without an IPv6 loopback is told once, and tried again as well: the loopback may come up
// later, and a process that took its port then would get what is meant for the agent. Every other failure is
// logged at once and then at lograte's gaps, naming the address, so the operator can tell which process to stop.
func WhenFree(ctx context.Context, addr, what string, log logr.Logger) net.Listener {
	var schedule lograte.Schedule
	toldNoIPv6 := false
	for {
		ln, err := net.Listen("tcp", addr)
		if err == nil {
			return ln
		}
		noIPv6 := isIPv6Loopback(addr) && (errors.Is(err, syscall.EADDRNOTAVAIL) || errors.Is(err, syscall.EAFNOSUPPORT))
		if noIPv6 && !toldNoIPv6 {
			log.Info("no IPv6 loopback on this node yet: "+what+" served on 127.0.0.1, and on ::1 once it is there", "address", addr)
			toldNoIPv6 = true
		}
		if !noIPv6 && schedule.Due(time.Now()) {
			log.Error(err, "cannot listen for "+what+": another process may hold the address; trying again", "address", addr,
				"every", Retry)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(Retry):
		}
	}
}

func isIPv6Loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	ip := net.ParseIP(host)
	return err == nil && ip != nil && ip.To4() == nil && ip.IsLoopback()
}
