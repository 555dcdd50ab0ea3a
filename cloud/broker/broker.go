// Package broker runs the controller's embedded MQTT broker (mochi-mqtt): agents connect to it with the client
// certificate KubeEdge issued their node, or a username and password per node, only while their Node is an edge
// node in the API server; its ACL lets a node publish only under its own topics and read only its own
// commands [P-AUTH-1], and everything the nodes publish goes to the liveness tracker in the order it arrived.
package broker

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/clock"

	"github.com/lifeline-edge/lifeline/cloud/liveness"
	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
)

// Config configures the embedded broker.
type Config struct {
	// Address to listen on, e.g. ":1883".
	Address string
	// TLS, when set, makes the listener TLS.
	TLS     *tls.Config
	Cluster string
	// CredentialsDir holds one file per node, named after the node, containing its password: a Secret mounted
	// as a volume. Files are read on each connection, so nodes can be added without a restart.
	CredentialsDir string
	// ClientCerts, when its CAs are set, admit a node by its KubeEdge client certificate [P-AUTH-5]; it needs TLS.
	ClientCerts ClientCerts
	// Nodes, when set, admits a node only while its Node is an edge node, whichever way it logs in [P-AUTH-6].
	Nodes Nodes
	// Clock tells certificates' validity (default: the real clock).
	Clock clock.PassiveClock
	// RecheckInterval is how often the live sessions are checked again: a revoked or expired certificate, a
	// password removed from CredentialsDir or changed, a Node gone or no longer an edge node ends its session
	// (default 10 s).
	RecheckInterval time.Duration
	// Limits bound connections and retained messages; zero fields take DefaultLimits' values.
	Limits Limits
	// Tracker receives what the nodes publish and counts what the broker refuses.
	Tracker *liveness.Tracker
	// Ingest, when set, takes the nodes' messages in the tracker's place (Tracker.Ingest otherwise): what
	// reaches the controller can then be watched.
	Ingest func(topic string, payload []byte, now time.Time)
	Logger *slog.Logger
}

// Broker is a running embedded broker.
type Broker struct {
	server   *mochi.Server
	listener *guardedListener
	tracker  *liveness.Tracker
	access   *nodeAccess
	cluster  string
	stop     chan struct{}
	stopped  sync.WaitGroup
}

// Start listens and serves until Close.
func Start(cfg Config) (*Broker, error) {
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	limits, err := cfg.Limits.withDefaults()
	if err != nil {
		return nil, err
	}
	server := mochi.New(&mochi.Options{InlineClient: true, Logger: logger, Capabilities: capabilities(),
		SysTopicResendInterval: sysTopicInterval})
	ingest := cfg.Ingest
	if ingest == nil {
		ingest = cfg.Tracker.Ingest
	}
	access := &nodeAccess{cluster: cfg.Cluster, dir: cfg.CredentialsDir, tracker: cfg.Tracker, ingest: ingest,
		certs: cfg.ClientCerts, revoked: &revocations{file: cfg.ClientCerts.RevokedFile}, nodes: cfg.Nodes, clock: clockOr(cfg.Clock)}
	listener := &guardedListener{id: "agents", address: cfg.Address, tls: cfg.TLS, limits: limits, refuse: cfg.Tracker.Drop,
		clients: &server.Listeners.ClientsWg}
	if cfg.ClientCerts.CAs != nil {
		if cfg.TLS == nil {
			return nil, fmt.Errorf("certificate login needs a TLS listener: set its certificate")
		}
		// The handshake asks for a certificate and checks that the client holds its key; the chain, the subject,
		// revocation and validity are checked at CONNECT, by the broker's clock, and refusals counted by reason.
		serverTLS := cfg.TLS.Clone()
		serverTLS.ClientAuth = tls.RequestClientCert
		serverTLS.ClientCAs = cfg.ClientCerts.CAs
		store := newSessionStore(access.clock, access.revokedOrUnknown, limits.MaxConnections*sessionsPerNode)
		listener.tls = listener.resumable(serverTLS, store, access.verifiedNode)
	}
	if err := server.AddHook(access, nil); err != nil {
		return nil, fmt.Errorf("adding the access hook: %w", err)
	}
	// The controller subscribes before the first node can connect, and the broker lives and dies with it: no one
	// would ever read a retained message, so the broker retains none [P-RETAIN-2]. What an agent publishes is
	// taken in OnPublish; what reaches this subscription is what the broker publishes for an agent: its last
	// will, its death.
	err = server.Subscribe(lifelinev1.ControllerFilter(cfg.Cluster), 1, func(_ *mochi.Client, _ packets.Subscription, pk packets.Packet) {
		ingest(pk.TopicName, pk.Payload, time.Now())
	})
	if err != nil {
		return nil, fmt.Errorf("subscribing to the agents' topics: %w", err)
	}
	if err := server.AddListener(listener); err != nil {
		return nil, fmt.Errorf("adding the agents' listener: %w", err)
	}
	access.sessions = listener
	if err := server.Serve(); err != nil {
		server.Close()
		return nil, fmt.Errorf("serving MQTT: %w", err)
	}
	b := &Broker{server: server, listener: listener, tracker: cfg.Tracker, access: access, cluster: cfg.Cluster, stop: make(chan struct{})}
	interval := cfg.RecheckInterval
	if interval <= 0 {
		interval = 10 * time.Second
	}
	b.stopped.Add(1)
	go func() {
		defer b.stopped.Done()
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			select {
			case <-b.stop:
				return
			case <-tick.C:
				b.Recheck()
			}
		}
	}()
	return b, nil
}

// Recheck ends every live session that would no longer be admitted: its certificate revoked or expired, its
// password removed or changed, its Node gone or no longer an edge node [P-AUTH-6]. It runs every
// RecheckInterval; it returns the nodes whose sessions it ended.
func (b *Broker) Recheck() []string {
	var ended []string
	for _, cl := range b.server.Clients.GetAll() {
		if cl.Net.Inline || cl.Closed() {
			continue
		}
		node := string(cl.Properties.Username)
		if reason, err := b.access.stillAdmitted(cl.Net.Conn, node); err != nil {
			b.tracker.Drop(reason, err.Error())
			_ = b.server.DisconnectClient(cl, packets.ErrNotAuthorized)
			ended = append(ended, node)
		}
	}
	return ended
}

// CloseNode ends the live session of a node's agent, as when its Node is deleted or stops being an edge node.
// The broker publishes the agent's last will, its death. It tells whether there was a session.
func (b *Broker) CloseNode(node string) bool {
	cl, ok := b.server.Clients.Get(lifelinev1.AgentClientID(node))
	if !ok || cl.Net.Inline || cl.Closed() {
		return false
	}
	b.tracker.Drop(RefusedNotEdgeNode, fmt.Sprintf("node %q: session ended, its Node is gone or not an edge node", node))
	_ = b.server.DisconnectClient(cl, packets.ErrNotAuthorized)
	return true
}

// PublishCommand sends a command to a node's agent (QoS 1, not retained) [P-AUTH-2]. It fails when the agent
// has as many commands unacknowledged as the broker keeps for one client: the broker would drop this one
// without a word.
func (b *Broker) PublishCommand(node string, payload []byte) error {
	return b.publishToAgent(node, lifelinev1.KindCommand, payload)
}

// PublishDesired sends a node's agent its DesiredWorkers set (QoS 1, not retained) [P-DES-1], as PublishCommand.
func (b *Broker) PublishDesired(node string, payload []byte) error {
	return b.publishToAgent(node, lifelinev1.KindDesired, payload)
}

func (b *Broker) publishToAgent(node string, kind lifelinev1.Kind, payload []byte) error {
	maxInflight := int(b.server.Options.Capabilities.MaximumInflight)
	if cl, ok := b.server.Clients.Get(lifelinev1.AgentClientID(node)); ok && cl.State.Inflight.Len() >= maxInflight {
		b.tracker.Drop(RefusedSlowClient, fmt.Sprintf("node %q: %d messages unacknowledged", node, maxInflight))
		return fmt.Errorf("sending %s to node %s: its agent has not acknowledged its last %d messages", kind, node, maxInflight)
	}
	return b.server.Publish(lifelinev1.NodeTopic(b.cluster, node, kind).String(), payload, false, 1)
}

// Close stops the broker.
func (b *Broker) Close() error {
	select {
	case <-b.stop:
	default:
		close(b.stop)
	}
	b.stopped.Wait()
	return b.server.Close()
}

// nodeAccess authenticates nodes, binds each session to its node, enforces the ACL and bounds what a node
// publishes. The controller's own inline client bypasses it.
type nodeAccess struct {
	mochi.HookBase
	cluster, dir string
	tracker      *liveness.Tracker
	ingest       func(topic string, payload []byte, now time.Time) // takes an admitted message
	certs        ClientCerts
	revoked      *revocations
	nodes        Nodes // nil: no Node check
	clock        clock.PassiveClock
	sessions     *guardedListener // bounds the authenticated sessions
}

func (h *nodeAccess) ID() string { return "lifeline-node-access" }

func (h *nodeAccess) Provides(b byte) bool {
	return b == mochi.OnConnectAuthenticate || b == mochi.OnACLCheck || b == mochi.OnPublish || b == mochi.OnWill
}

// OnConnectAuthenticate admits a node by its certificate [P-AUTH-5] or its password, under its own client id
// only, while its Node is an edge node [P-AUTH-6], with no last will or its own death as the will. The client id
// is bound to the node because a CONNECT with a connected client's id takes that session over and fires its
// will: any other id would let one node announce another's death. The node's own reconnect (same id, same
// credentials) still takes over its old, perhaps half-open, session. The session's username is set to the node,
// which the ACL reads. Only then does the connection leave the budget of those not yet authenticated for the
// sessions' own.
func (h *nodeAccess) OnConnectAuthenticate(cl *mochi.Client, pk packets.Packet) bool {
	node, password, ok := h.identify(cl, pk)
	if !ok {
		return false
	}
	if cl.ID != lifelinev1.AgentClientID(node) {
		h.tracker.Drop(RefusedClientID, fmt.Sprintf("node %q: client id %q, not %q", node, cl.ID, lifelinev1.AgentClientID(node)))
		return false
	}
	if pk.Connect.WillFlag {
		if pk.Connect.WillTopic != lifelinev1.NodeTopic(h.cluster, node, lifelinev1.KindDeath).String() {
			h.tracker.Drop(liveness.DropAuth, fmt.Sprintf("node %q: last will on %q", node, pk.Connect.WillTopic))
			return false
		}
		if len(pk.Connect.WillPayload) > maxPayload[lifelinev1.KindDeath] {
			h.tracker.Drop(RefusedTooLarge, fmt.Sprintf("node %q: last will of %d bytes", node, len(pk.Connect.WillPayload)))
			return false
		}
	}
	if reason, err := h.edgeNode(node); err != nil {
		h.tracker.Drop(reason, err.Error())
		return false
	}
	if err := h.sessions.promote(cl.Net.Conn, node, password); err != nil {
		h.tracker.Drop(RefusedConnections, fmt.Sprintf("node %q from %s: %v", node, cl.Net.Remote, err))
		return false
	}
	cl.Properties.Username = []byte(node)
	return true
}

// identify returns the node a client is: the one its certificate names, when certificate login is on and it
// presented one (a username, if any, must be that node), else the one whose password it knows, with the
// digest of that password, against which its session is checked again.
func (h *nodeAccess) identify(cl *mochi.Client, pk packets.Packet) (node string, password *[sha256.Size]byte, ok bool) {
	user := string(pk.Connect.Username)
	if h.certs.CAs != nil {
		node, reason, err := h.certIdentity(peerCertificates(cl.Net.Conn), h.clock.Now())
		switch {
		case err == nil && user != "" && user != node:
			h.tracker.Drop(liveness.DropAuth, fmt.Sprintf("client %q: user %q, but its certificate is node %q's", cl.ID, user, node))
			return "", nil, false
		case err == nil:
			return node, nil, true
		case !errors.Is(err, errNoCertificate): // a certificate that fails is refused, whatever the password
			h.tracker.Drop(reason, fmt.Sprintf("client %q: %v", cl.ID, err))
			return "", nil, false
		}
	}
	if !h.passwordMatches(user, pk.Connect.Password) {
		h.tracker.Drop(liveness.DropAuth, fmt.Sprintf("client %q with user %q: bad credentials", cl.ID, user))
		return "", nil, false
	}
	digest := sha256.Sum256(pk.Connect.Password)
	return user, &digest, true
}

// edgeNode checks that node's Node is an edge node; the reason to count when not.
func (h *nodeAccess) edgeNode(node string) (string, error) {
	if h.nodes == nil {
		return "", nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ok, err := h.nodes.IsEdgeNode(ctx, node)
	switch {
	case err != nil:
		return RefusedNotEdgeNode, fmt.Errorf("node %q: %w", node, err)
	case !ok:
		return RefusedNotEdgeNode, fmt.Errorf("node %q: no edge Node of that name", node)
	}
	return "", nil
}

// stillAdmitted checks a live session of node again: its certificate, if it logged in with one, else its
// password (still the node's in CredentialsDir: a key deleted from the Secret, or changed, ends the session),
// and its Node.
func (h *nodeAccess) stillAdmitted(conn net.Conn, node string) (string, error) {
	if chain := peerCertificates(conn); h.certs.CAs != nil && len(chain) > 0 {
		certNode, reason, err := h.certIdentity(chain, h.clock.Now())
		if err != nil {
			return reason, fmt.Errorf("node %q: session ended: %w", node, err)
		}
		if certNode != node {
			return liveness.DropAuth, fmt.Errorf("node %q: session ended: its certificate is node %q's", node, certNode)
		}
	}
	if gc := guardedOf(conn); gc != nil {
		if digest := gc.password.Load(); digest != nil {
			if err := h.passwordStill(node, digest); err != nil {
				return liveness.DropAuth, fmt.Errorf("node %q: session ended: %w", node, err)
			}
		}
	}
	return h.edgeNode(node)
}

// password reads node's password from CredentialsDir.
func (h *nodeAccess) password(node string) ([]byte, error) {
	if h.dir == "" || len(validation.IsDNS1123Subdomain(node)) > 0 {
		return nil, fmt.Errorf("no password login for user %q", node)
	}
	want, err := os.ReadFile(filepath.Join(h.dir, node))
	if err != nil {
		return nil, fmt.Errorf("reading the password of node %q: %w", node, err)
	}
	return bytes.TrimSpace(want), nil
}

func (h *nodeAccess) passwordMatches(node string, password []byte) bool {
	if len(password) == 0 {
		return false
	}
	want, err := h.password(node)
	return err == nil && subtle.ConstantTimeCompare(want, password) == 1
}

// passwordStill checks that node's password is still the one of digest.
func (h *nodeAccess) passwordStill(node string, digest *[sha256.Size]byte) error {
	want, err := h.password(node)
	if err != nil {
		return fmt.Errorf("its password is gone: %w", err)
	}
	if now := sha256.Sum256(want); subtle.ConstantTimeCompare(now[:], digest[:]) != 1 {
		return fmt.Errorf("its password changed")
	}
	return nil
}

// OnACLCheck: a node writes only its own topics (never the controller's commands and desired sets) and reads only
// its own commands and desired sets.
func (h *nodeAccess) OnACLCheck(cl *mochi.Client, topic string, write bool) bool {
	node := string(cl.Properties.Username)
	allowed := false
	if write {
		tp, err := lifelinev1.ParseTopic(topic)
		allowed = err == nil && tp.Cluster == h.cluster && tp.Node == node && !lifelinev1.FromController(tp.Kind)
	} else {
		allowed = topic == lifelinev1.AgentCommandTopic(h.cluster, node) || topic == lifelinev1.AgentDesiredTopic(h.cluster, node)
	}
	if !allowed {
		h.tracker.Drop(liveness.DropDenied, fmt.Sprintf("node %q %s %q", node, map[bool]string{true: "publishing to", false: "subscribing to"}[write], topic))
	}
	return allowed
}

// OnPublish applies publishVerdict to a node's message, after the ACL admitted its topic. A refused message is
// acknowledged and discarded (MQTT 3.1.1 cannot refuse one message without ending the session, and the agent
// would send it again), and counted. An admitted one is handed to the controller here, on the publishing
// client's goroutine (a node's messages reach it in order), then acknowledged and delivered to no one, retained
// by no one: the controller is the only reader of the agents' topics (an agent may read only its own commands and
// sets), and mochi's delivery copies its table of subscribers for every message, a ninth of what the controller
// allocated in an outage at 1,000 nodes.
func (h *nodeAccess) OnPublish(cl *mochi.Client, pk packets.Packet) (packets.Packet, error) {
	if cl.Net.Inline {
		return pk, nil
	}
	tp, err := lifelinev1.ParseTopic(pk.TopicName)
	if err != nil { // the ACL refused it already
		return pk, packets.CodeSuccessIgnore
	}
	deliver, reason := publishVerdict(tp.Kind, len(pk.Payload), pk.FixedHeader.Retain)
	if reason != "" {
		h.tracker.Drop(reason, fmt.Sprintf("%s: %d bytes, retain %t", pk.TopicName, len(pk.Payload), pk.FixedHeader.Retain))
	}
	if deliver {
		h.ingest(pk.TopicName, pk.Payload, time.Now())
	}
	return pk, packets.CodeSuccessIgnore
}

// OnWill delivers a node's last will, its death, unretained: nothing of the agents' is retained.
func (h *nodeAccess) OnWill(_ *mochi.Client, will mochi.Will) (mochi.Will, error) {
	will.Retain = false
	return will, nil
}

// publishVerdict decides on a node's message of kind, with a payload of size bytes: over its kind's cap it is
// refused; a retain flag where the protocol never retains (anything but births, deaths and worker states) is
// counted, and the message delivered.
func publishVerdict(kind lifelinev1.Kind, size int, retain bool) (deliver bool, reason string) {
	switch {
	case size > maxPayload[kind]:
		return false, RefusedTooLarge
	case retain && size > 0 && kind != lifelinev1.KindBirth && kind != lifelinev1.KindDeath && kind != lifelinev1.KindWorkerState:
		return true, RefusedRetain
	}
	return true, ""
}

// Sessions is how many authenticated sessions are open, and how many may be (Limits.MaxConnections).
func (b *Broker) Sessions() (open, limit int) {
	b.listener.mu.Lock()
	defer b.listener.mu.Unlock()
	return len(b.listener.sessions), b.listener.limits.MaxConnections
}

// SessionMetrics is a collector of the running embedded broker's sessions and their limit, read from current at
// each scrape; it reports nothing while no broker runs (a standby controller, an external broker), so an alert
// on a fleet near the limit reads the leader's.
func SessionMetrics(current func() *Broker) prometheus.Collector {
	return &sessionCollector{current: current,
		open: prometheus.NewDesc("lifeline_broker_sessions",
			"Agents' sessions the embedded broker holds open, authenticated.", nil, nil),
		limit: prometheus.NewDesc("lifeline_broker_max_sessions",
			"Authenticated sessions the embedded broker admits at most (--mqtt-max-connections); beyond, a CONNECT is refused.", nil, nil)}
}

type sessionCollector struct {
	current     func() *Broker
	open, limit *prometheus.Desc
}

func (c *sessionCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.open; ch <- c.limit }

func (c *sessionCollector) Collect(ch chan<- prometheus.Metric) {
	b := c.current()
	if b == nil {
		return
	}
	open, limit := b.Sessions()
	ch <- prometheus.MustNewConstMetric(c.open, prometheus.GaugeValue, float64(open))
	ch <- prometheus.MustNewConstMetric(c.limit, prometheus.GaugeValue, float64(limit))
}
