package broker

import (
	"fmt"
	"time"

	mochi "github.com/mochi-mqtt/server/v2"

	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
)

// Reasons the broker refuses a connection or a message, counted in lifeline_liveness_dropped_total{reason}.
const (
	RefusedConnections    = "connections"      // good credentials beyond Limits.MaxConnections sessions: the CONNECT is refused
	RefusedPreAuthEvicted = "pre-auth-evicted" // a connection not yet authenticated, closed to admit a newer one (Limits.MaxUnauthenticated)
	RefusedConnectTimeout = "connect-timeout"  // no TLS handshake within Limits.HandshakeTimeout, or no CONNECT within Limits.ConnectTimeout
	RefusedMalformed      = "malformed"        // garbage or a failed TLS handshake before the CONNECT
	RefusedTooLarge       = "too-large"        // a packet over maxPacketBytes, or a payload over its kind's cap
	RefusedClientID       = "client-id"        // a client id other than lifeline-agent-<user>
	RefusedRetain         = "retain"           // a retain flag on a kind the protocol never retains
	RefusedSlowClient     = "slow-client"      // a command to an agent that has not acknowledged the last 64: refused
	RefusedCertificate    = "certificate"      // a client certificate that does not verify (CA, validity, usage) or names no node [P-AUTH-5]
	RefusedRevoked        = "revoked"          // a client certificate whose serial is revoked, or while the revocation list is unreadable
	RefusedNotEdgeNode    = "not-edge-node"    // no Node of that name, or one without node-role.kubernetes.io/edge; a live session so ended too [P-AUTH-6]
)

// maxPayload bounds each kind's payload. Retained kinds are held in memory for as long as the node lives, so
// their bounds are tight; the others only pass through.
var maxPayload = map[lifelinev1.Kind]int{
	lifelinev1.KindBirth:       1 << 10, // a node name (at most 253 bytes), a boot id, a state id, a version, numbers
	lifelinev1.KindDeath:       1 << 10,
	lifelinev1.KindHeartbeat:   256,     // five numbers: 100 bytes on the wire with its topic [P-HB-2]
	lifelinev1.KindWorkerState: 4 << 10, // 34 containers with names of the longest legal length
	lifelinev1.KindReport:      maxReportBody + 1<<10,
	lifelinev1.KindResult:      maxReportBody + 1<<10, // an error message, which the agent passes on as it got it
	lifelinev1.KindDataset:     1 << 10,               // a namespace, a Dataset name, numbers
}

// maxReportBody is the largest body the agent's report API takes.
const maxReportBody = lifelinev1.MaxReportBodyBytes

// maxPacketBytes is the largest packet the broker reads: the largest payload (a report) with its topic (at most
// about 660 bytes of legal names) and the MQTT headers. Without it one CONNECT can announce 256 MiB and the
// broker allocates it before reading a byte of it.
var maxPacketBytes = uint32(maxPayload[lifelinev1.KindReport] + 1<<10)

// Limits bound what clients can make the broker hold. Connections that have not authenticated yet and
// authenticated sessions have budgets of their own, so that no number of clients that never log in can keep a
// node out. Zero fields take DefaultLimits' values.
type Limits struct {
	// MaxConnections is how many authenticated sessions may be open at once; a CONNECT with good credentials
	// beyond it is refused. A node's reconnect, which takes its old session over, is admitted at the limit.
	MaxConnections int
	// MaxUnauthenticated is how many connections may be open that have not authenticated yet (TLS handshake or
	// CONNECT in progress). When it is reached, the oldest such connection of the source holding the most is
	// closed to admit the new one: an agent completes its CONNECT in milliseconds, a flood's idle connections
	// are the oldest, and a flood from one source never closes another source's connection.
	MaxUnauthenticated int
	// MaxUnauthenticatedPerSource bounds the connections not yet authenticated of one source address (an IPv4
	// address, an IPv6 /64) the same way: the source's oldest makes room for its newest.
	MaxUnauthenticatedPerSource int
	// HandshakeTimeout: a TLS connection that has not completed its handshake this long after it opened is
	// closed (at most ConnectTimeout): a handshake takes round trips, not seconds.
	HandshakeTimeout time.Duration
	// ConnectTimeout: a connection that has not completed its CONNECT (TLS handshake included) this long after
	// it opened is closed.
	ConnectTimeout time.Duration
}

// DefaultLimits fit a 256 MiB controller with up to a few hundred edge nodes.
func DefaultLimits() Limits {
	return Limits{MaxConnections: 1000, MaxUnauthenticated: 256, MaxUnauthenticatedPerSource: 32,
		HandshakeTimeout: 3 * time.Second, ConnectTimeout: 5 * time.Second}
}

// withDefaults fills zero fields and rejects negative ones.
func (l Limits) withDefaults() (Limits, error) {
	d := DefaultLimits()
	if l.MaxConnections < 0 || l.MaxUnauthenticated < 0 || l.MaxUnauthenticatedPerSource < 0 || l.HandshakeTimeout < 0 || l.ConnectTimeout < 0 {
		return l, fmt.Errorf("broker limits must not be negative: %+v", l)
	}
	fill := func(v *int, def int) {
		if *v == 0 {
			*v = def
		}
	}
	fill(&l.MaxConnections, d.MaxConnections)
	fill(&l.MaxUnauthenticated, d.MaxUnauthenticated)
	fill(&l.MaxUnauthenticatedPerSource, d.MaxUnauthenticatedPerSource)
	if l.HandshakeTimeout == 0 {
		l.HandshakeTimeout = d.HandshakeTimeout
	}
	if l.ConnectTimeout == 0 {
		l.ConnectTimeout = d.ConnectTimeout
	}
	l.HandshakeTimeout = min(l.HandshakeTimeout, l.ConnectTimeout)
	return l, nil
}

// capabilities are mochi's per-client bounds, sized for the protocol: an agent sends one QoS 1 message at a time
// and waits for its acknowledgement, and receives only commands.
func capabilities() *mochi.Capabilities {
	c := mochi.NewDefaultServerCapabilities()
	c.MaximumPacketSize = maxPacketBytes
	c.ReceiveMaximum = 16             // QoS 1 messages of a client not yet acknowledged (default 1024)
	c.MaximumInflight = 64            // commands stored for one agent, unacknowledged (default 8192)
	c.MaximumClientWritesPending = 64 // packets queued to one client that does not read; allocated per connection (default 8192)
	c.TopicAliasMaximum = 0           // no aliases: each would hold a topic string per client (default 65535)
	c.MaximumQos = 1                  // the protocol uses QoS 0 and 1; QoS 2 only adds state
	// Sessions end with their connection (agents use clean sessions): nothing is kept for a client that left.
	c.MaximumSessionExpiryInterval = 0
	c.MaximumMessageExpiryInterval = 0 // nothing is held long enough to expire: no retained messages, no sessions
	return c
}

// sysTopicInterval is how often, in seconds, mochi publishes its $SYS topics (default every second, each
// retained, with a read of the runtime's memory statistics): no client may read them, so once a day.
const sysTopicInterval = 24 * 60 * 60
