package broker

import (
	"crypto/tls"
	"fmt"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/lifeline-edge/lifeline/cloud/liveness"
	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
)

// ExternalConfig configures the controller's session with an operator's broker (mosquitto, EMQX, ...).
type ExternalConfig struct {
	// URL of the broker: tcp://host:port or ssl://host:port.
	URL                string
	Username, Password string
	TLS                *tls.Config
	Cluster            string
	Tracker            *liveness.Tracker
}

// External is the controller's session with an external broker. That broker enforces the nodes' ACL [P-AUTH-1];
// the tracker still drops what a payload or the pod's binding contradicts in the topic [P-AUTH-3].
//
// Only the elected leader runs a session, and it subscribes without `$share`: one subscriber gets every message
// once, retained births and worker states included, which a shared subscription would withhold.
type External struct {
	client  mqtt.Client
	cluster string
}

// connectTimeout bounds the first connection attempt, which Connect waits for.
const connectTimeout = 10 * time.Second

// Connect opens the session; it reconnects and subscribes again by itself until Close. When the first attempt
// fails, Connect returns why (the broker refused the connection, the login, or did not answer within 10 s), and
// the caller tries again.
func Connect(cfg ExternalConfig) (*External, error) {
	filter := lifelinev1.ControllerFilter(cfg.Cluster)
	ingest := func(_ mqtt.Client, m mqtt.Message) { cfg.Tracker.Ingest(m.Topic(), m.Payload(), time.Now()) }
	opts := mqtt.NewClientOptions().AddBroker(cfg.URL).SetClientID("lifeline-controller-" + cfg.Cluster).
		SetUsername(cfg.Username).SetPassword(cfg.Password).SetCleanSession(true).
		// Only a session that was up reconnects by itself: the first attempt's error goes back to the caller.
		SetAutoReconnect(true).SetConnectRetry(false).SetConnectTimeout(connectTimeout).
		SetOrderMatters(true). // a node's messages reach the tracker in the order the broker sent them
		SetOnConnectHandler(func(c mqtt.Client) { c.Subscribe(filter, 1, ingest) })
	if cfg.TLS != nil {
		opts.SetTLSConfig(cfg.TLS)
	}
	client := mqtt.NewClient(opts)
	tok := client.Connect()
	if !tok.WaitTimeout(connectTimeout + time.Second) {
		client.Disconnect(0)
		return nil, fmt.Errorf("connecting to %s: no answer within %s", cfg.URL, connectTimeout)
	}
	if err := tok.Error(); err != nil {
		client.Disconnect(0)
		return nil, fmt.Errorf("connecting to %s: %w", cfg.URL, err)
	}
	return &External{client: client, cluster: cfg.Cluster}, nil
}

// PublishCommand sends a command to a node's agent (QoS 1, not retained) and waits for the broker to take it.
func (e *External) PublishCommand(node string, payload []byte) error {
	return e.publishToAgent(node, lifelinev1.KindCommand, payload)
}

// PublishDesired sends a node's agent its DesiredWorkers set (QoS 1, not retained) [P-DES-1], as PublishCommand.
func (e *External) PublishDesired(node string, payload []byte) error {
	return e.publishToAgent(node, lifelinev1.KindDesired, payload)
}

func (e *External) publishToAgent(node string, kind lifelinev1.Kind, payload []byte) error {
	tok := e.client.Publish(lifelinev1.NodeTopic(e.cluster, node, kind).String(), 1, false, payload)
	if !tok.WaitTimeout(5 * time.Second) {
		return fmt.Errorf("publishing %s to %s: no acknowledgement within 5 s", kind, node)
	}
	return tok.Error()
}

// Close ends the session.
func (e *External) Close() error {
	e.client.Disconnect(250)
	return nil
}
