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
	"github.com/mochi-mqtt/server/v2/listeners"
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
	Tracker        *liveness.Tracker
	Logger         *slog.Logger
}

// Broker is a running embedded broker.
type Broker struct {
	server  *mochi.Server
	cluster string
}

// Start listens and serves until Close.
func Start(cfg Config) (*Broker, error) {
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	server := mochi.New(&mochi.Options{InlineClient: true, Logger: logger})
	if err := server.AddHook(&nodeAccess{cluster: cfg.Cluster, dir: cfg.CredentialsDir, tracker: cfg.Tracker}, nil); err != nil {
		return nil, fmt.Errorf("adding the access hook: %w", err)
	}
	if err := server.AddListener(listeners.NewTCP(listeners.Config{ID: "agents", Address: cfg.Address, TLSConfig: cfg.TLS})); err != nil {
		return nil, fmt.Errorf("listening on %s: %w", cfg.Address, err)
	}
	if err := server.Serve(); err != nil {
		return nil, fmt.Errorf("serving MQTT: %w", err)
	}
	// Inline handlers run on the publishing client's goroutine: a node's messages reach the tracker in order.
	err := server.Subscribe(lifelinev1.ControllerFilter(cfg.Cluster), 1, func(_ *mochi.Client, _ packets.Subscription, pk packets.Packet) {
		cfg.Tracker.Ingest(pk.TopicName, pk.Payload, time.Now())
	})
	if err != nil {
		server.Close()
		return nil, fmt.Errorf("subscribing to the agents' topics: %w", err)
	}
	return &Broker{server: server, cluster: cfg.Cluster}, nil
}

// PublishCommand sends a command to a node's agent (QoS 1, not retained) [P-AUTH-2].
func (b *Broker) PublishCommand(node string, payload []byte) error {
	return b.server.Publish(lifelinev1.AgentCommandTopic(b.cluster, node), payload, false, 1)
}

// Close stops the broker.
func (b *Broker) Close() error { return b.server.Close() }

// nodeAccess authenticates nodes and enforces the ACL. The controller's own inline client bypasses it.
type nodeAccess struct {
	mochi.HookBase
	cluster, dir string
	tracker      *liveness.Tracker
}

func (h *nodeAccess) ID() string { return "lifeline-node-access" }

func (h *nodeAccess) Provides(b byte) bool {
	return b == mochi.OnConnectAuthenticate || b == mochi.OnACLCheck
}

// OnConnectAuthenticate admits a node by its password, with no last will or its own death as the will.
func (h *nodeAccess) OnConnectAuthenticate(cl *mochi.Client, pk packets.Packet) bool {
	node := string(pk.Connect.Username)
	if !h.passwordMatches(node, pk.Connect.Password) {
		h.tracker.Drop(liveness.DropAuth, fmt.Sprintf("client %q with user %q: bad credentials", cl.ID, node))
		return false
	}
	if pk.Connect.WillFlag && pk.Connect.WillTopic != lifelinev1.NodeTopic(h.cluster, node, lifelinev1.KindDeath).String() {
		h.tracker.Drop(liveness.DropAuth, fmt.Sprintf("node %q: last will on %q", node, pk.Connect.WillTopic))
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
