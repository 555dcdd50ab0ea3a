// Package broker runs the controller's embedded MQTT broker (mochi-mqtt): agents connect to it with a
// username and password per node, its ACL lets a node publish only under its own topics and read only its own
// commands [P-AUTH-1], and everything the nodes publish goes to the liveness tracker in the order it arrived.
package broker

import (
	"bytes"
	"crypto/subtle"
	"crypto/tls"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/lifeline-edge/lifeline/cloud/liveness"
	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
)

// Config configures the embedded broker.
type Config struct {
	// Address to listen on, e.g. ":1883".
	Address string
	// TLS, when set, makes the listener TLS (client certificates are the operator's choice).
	TLS     *tls.Config
	Cluster string
	// CredentialsDir holds one file per node, named after the node, containing its password: a Secret mounted
	// as a volume. Files are read on each connection, so nodes can be added without a restart.
	CredentialsDir string
	// Limits bound connections and retained messages; zero fields take DefaultLimits' values.
	Limits Limits
	// Tracker receives what the nodes publish and counts what the broker refuses.
	Tracker *liveness.Tracker
	Logger  *slog.Logger
}

// Broker is a running embedded broker.
type Broker struct {
	server   *mochi.Server
	listener *guardedListener
	tracker  *liveness.Tracker
	cluster  string
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
	server := mochi.New(&mochi.Options{InlineClient: true, Logger: logger, Capabilities: capabilities()})
	access := &nodeAccess{cluster: cfg.Cluster, dir: cfg.CredentialsDir, tracker: cfg.Tracker,
		maxRetainedWorkers: limits.MaxRetainedWorkers, topics: server.Topics}
	if err := server.AddHook(access, nil); err != nil {
		return nil, fmt.Errorf("adding the access hook: %w", err)
	}
	listener := &guardedListener{id: "agents", address: cfg.Address, tls: cfg.TLS, maxConns: limits.MaxConnections,
		connectTimeout: limits.ConnectTimeout, refuse: cfg.Tracker.Drop}
	if err := server.AddListener(listener); err != nil {
		return nil, err
	}
	if err := server.Serve(); err != nil {
		return nil, fmt.Errorf("serving MQTT: %w", err)
	}
	// Inline handlers run on the publishing client's goroutine: a node's messages reach the tracker in order.
	err = server.Subscribe(lifelinev1.ControllerFilter(cfg.Cluster), 1, func(_ *mochi.Client, _ packets.Subscription, pk packets.Packet) {
		cfg.Tracker.Ingest(pk.TopicName, pk.Payload, time.Now())
	})
	if err != nil {
		server.Close()
		return nil, fmt.Errorf("subscribing to the agents' topics: %w", err)
	}
	return &Broker{server: server, listener: listener, tracker: cfg.Tracker, cluster: cfg.Cluster}, nil
}

// PublishCommand sends a command to a node's agent (QoS 1, not retained) [P-AUTH-2]. It fails when the agent
// has as many commands unacknowledged as the broker keeps for one client: the broker would drop this one
// without a word.
func (b *Broker) PublishCommand(node string, payload []byte) error {
	maxInflight := int(b.server.Options.Capabilities.MaximumInflight)
	if cl, ok := b.server.Clients.Get(lifelinev1.AgentClientID(node)); ok && cl.State.Inflight.Len() >= maxInflight {
		b.tracker.Drop(RefusedSlowClient, fmt.Sprintf("node %q: %d commands unacknowledged", node, maxInflight))
		return fmt.Errorf("commanding node %s: its agent has not acknowledged its last %d commands", node, maxInflight)
	}
	return b.server.Publish(lifelinev1.AgentCommandTopic(b.cluster, node), payload, false, 1)
}

// Close stops the broker.
func (b *Broker) Close() error { return b.server.Close() }

// nodeAccess authenticates nodes, binds each session to its node, enforces the ACL and bounds what a node
// retains. The controller's own inline client bypasses it.
type nodeAccess struct {
	mochi.HookBase
	cluster, dir       string
	tracker            *liveness.Tracker
	maxRetainedWorkers int
	topics             *mochi.TopicsIndex // the server's, where retained messages are
}

func (h *nodeAccess) ID() string { return "lifeline-node-access" }

func (h *nodeAccess) Provides(b byte) bool {
	return b == mochi.OnConnectAuthenticate || b == mochi.OnACLCheck || b == mochi.OnPublish
}

// OnConnectAuthenticate admits a node by its password, under its own client id only, with no last will or its
// own death as the will. The client id is bound to the node because a CONNECT with a connected client's id
// takes that session over and fires its will: any other id would let one node announce another's death. The
// node's own reconnect (same id, same password) still takes over its old, perhaps half-open, session.
func (h *nodeAccess) OnConnectAuthenticate(cl *mochi.Client, pk packets.Packet) bool {
	node := string(pk.Connect.Username)
	if !h.passwordMatches(node, pk.Connect.Password) {
		h.tracker.Drop(liveness.DropAuth, fmt.Sprintf("client %q with user %q: bad credentials", cl.ID, node))
		return false
	}
	if cl.ID != lifelinev1.AgentClientID(node) {
		h.tracker.Drop(RefusedClientID, fmt.Sprintf("node %q: client id %q, not %q", node, cl.ID, lifelinev1.AgentClientID(node)))
		return false
	}
	if !pk.Connect.WillFlag {
		return true
	}
	if pk.Connect.WillTopic != lifelinev1.NodeTopic(h.cluster, node, lifelinev1.KindDeath).String() {
		h.tracker.Drop(liveness.DropAuth, fmt.Sprintf("node %q: last will on %q", node, pk.Connect.WillTopic))
		return false
	}
	if len(pk.Connect.WillPayload) > maxPayload[lifelinev1.KindDeath] {
		h.tracker.Drop(RefusedTooLarge, fmt.Sprintf("node %q: last will of %d bytes", node, len(pk.Connect.WillPayload)))
		return false
	}
	return true
}

func (h *nodeAccess) passwordMatches(node string, password []byte) bool {
	if h.dir == "" || len(validation.IsDNS1123Subdomain(node)) > 0 || len(password) == 0 {
		return false
	}
	want, err := os.ReadFile(filepath.Join(h.dir, node))
	if err != nil {
		return false
	}
	return subtle.ConstantTimeCompare(bytes.TrimSpace(want), password) == 1
}

// OnACLCheck: a node writes only its own topics (never commands) and reads only its own commands.
func (h *nodeAccess) OnACLCheck(cl *mochi.Client, topic string, write bool) bool {
	node := string(cl.Properties.Username)
	allowed := false
	if write {
		tp, err := lifelinev1.ParseTopic(topic)
		allowed = err == nil && tp.Cluster == h.cluster && tp.Node == node && tp.Kind != lifelinev1.KindCommand
	} else {
		allowed = topic == lifelinev1.AgentCommandTopic(h.cluster, node)
	}
	if !allowed {
		h.tracker.Drop(liveness.DropDenied, fmt.Sprintf("node %q %s %q", node, map[bool]string{true: "publishing to", false: "subscribing to"}[write], topic))
	}
	return allowed
}

// OnPublish applies publishVerdict to a node's message, after the ACL admitted its topic. A refused message is
// acknowledged and discarded (MQTT 3.1.1 cannot refuse one message without ending the session, and the agent
// would send it again), and counted.
func (h *nodeAccess) OnPublish(cl *mochi.Client, pk packets.Packet) (packets.Packet, error) {
	if cl.Net.Inline {
		return pk, nil
	}
	tp, err := lifelinev1.ParseTopic(pk.TopicName)
	if err != nil { // the ACL refused it already
		return pk, packets.CodeSuccessIgnore
	}
	retainedWorkers, retainedHere := 0, false
	if tp.Kind == lifelinev1.KindWorkerState && pk.FixedHeader.Retain {
		_, retainedHere = h.topics.Retained.Get(pk.TopicName)
		if !retainedHere {
			retainedWorkers = len(h.topics.Messages(lifelinev1.WorkerTopic(tp.Cluster, tp.Node, "+", "+").String()))
		}
	}
	verdict, reason := publishVerdict(tp.Kind, len(pk.Payload), pk.FixedHeader.Retain, retainedHere, retainedWorkers, h.maxRetainedWorkers)
	if reason != "" {
		h.tracker.Drop(reason, fmt.Sprintf("%s: %d bytes, retain %t", pk.TopicName, len(pk.Payload), pk.FixedHeader.Retain))
	}
	switch verdict {
	case refuse:
		return pk, packets.CodeSuccessIgnore
	case deliverUnretained:
		pk.FixedHeader.Retain = false
	}
	return pk, nil
}

// verdict is what the broker does with a node's message.
type verdict int

const (
	deliver           verdict = iota // as published
	deliverUnretained                // to the controller, but not retained
	refuse                           // not at all
)

// publishVerdict decides on a node's message of kind, with a payload of size bytes: over its kind's cap it is
// refused; a retain flag is honoured only where the protocol retains (birth, death, worker states), and for a
// worker topic not yet retained (retainedHere false) only while the node has fewer than maxRetained
// (retainedWorkers counts them). An empty retained payload deletes a retained message and is always allowed.
func publishVerdict(kind lifelinev1.Kind, size int, retain, retainedHere bool, retainedWorkers, maxRetained int) (verdict, string) {
	switch {
	case size > maxPayload[kind]:
		return refuse, RefusedTooLarge
	case !retain || size == 0:
		return deliver, ""
	case kind != lifelinev1.KindBirth && kind != lifelinev1.KindDeath && kind != lifelinev1.KindWorkerState:
		return deliverUnretained, RefusedRetain
	case kind == lifelinev1.KindWorkerState && !retainedHere && retainedWorkers >= maxRetained:
		return deliverUnretained, RefusedRetainCap
	}
	return deliver, ""
}
