// Package publisher is the edge agent's MQTT session: it announces the node with a retained birth, leaves a
// retained death as its last will, and sends journaled messages in order, removing each from the journal only
// once the broker acknowledged it. A broken session is replaced by a new one with the next birth sequence.
package publisher

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/go-logr/logr"
	"google.golang.org/protobuf/proto"

	"github.com/lifeline-edge/lifeline/edge/journal"
	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
)

// Journal is what the publisher needs of the journal.
type Journal interface {
	Put(journal.Entry) (uint64, error)
	Pending() ([]journal.Entry, error)
	Ack(seq uint64) error
}

// Config configures the session.
type Config struct {
	// Broker is the broker's URL: tcp://host:port or ssl://host:port.
	Broker             string
	Username, Password string
	TLS                *tls.Config
	Cluster, Node      string
	AgentVersion       string
	BootID             string
	// StateDir keeps the birth sequence across restarts [P-BIRTH-2].
	StateDir string
	// RetryInterval is the wait between connection attempts (default 1 s).
	RetryInterval time.Duration
	// AckTimeout bounds the wait for the broker's acknowledgement of one message (default 5 s).
	AckTimeout time.Duration
	// OnCommand, when set, receives the payload of every message on the node's commands topic, the only topic
	// an agent subscribes to.
	OnCommand func(payload []byte)
	Log       logr.Logger
}

// Publisher owns the MQTT session.
type Publisher struct {
	cfg     Config
	journal Journal
	wake    chan struct{}

	mu        sync.Mutex // guards client and birthSeq
	client    mqtt.Client
	birthSeq  uint64
	connected bool
}

// New returns a publisher; Run connects it.
func New(cfg Config, j Journal) *Publisher {
	if cfg.RetryInterval == 0 {
		cfg.RetryInterval = time.Second
	}
	if cfg.AckTimeout == 0 {
		cfg.AckTimeout = 5 * time.Second
	}
	return &Publisher{cfg: cfg, journal: j, wake: make(chan struct{}, 1)}
}

// Enqueue journals a message and wakes the sender; it never blocks on the network.
func (p *Publisher) Enqueue(e journal.Entry) error {
	if _, err := p.journal.Put(e); err != nil {
		return err
	}
	select {
	case p.wake <- struct{}{}:
	default:
	}
	return nil
}

// Connected tells whether a session is up.
func (p *Publisher) Connected() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.connected
}

// BirthSeq is the birth sequence of the current (or last) session.
func (p *Publisher) BirthSeq() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.birthSeq
}

// PublishNow sends a QoS 0 message if a session is up (heartbeats): it is not journaled, a newer one follows.
func (p *Publisher) PublishNow(topic string, payload []byte) bool {
	p.mu.Lock()
	c, ok := p.client, p.connected
	p.mu.Unlock()
	if !ok {
		return false
	}
	c.Publish(topic, 0, false, payload)
	return true
}

// Run keeps a session up and drains the journal until ctx ends.
func (p *Publisher) Run(ctx context.Context) {
	for ctx.Err() == nil {
		lost, err := p.connect(ctx)
		if err != nil {
			p.cfg.Log.V(2).Info("broker unreachable", "broker", p.cfg.Broker, "error", err.Error())
			sleep(ctx, p.cfg.RetryInterval)
			continue
		}
		p.drainUntilLost(ctx, lost)
		p.mu.Lock()
		p.connected = false
		client := p.client
		p.mu.Unlock()
		if ctx.Err() != nil {
			p.sayGoodbye(client)
		}
		client.Disconnect(100)
	}
}

// connect opens a session with the next birth sequence, its death as last will, and publishes the birth.
func (p *Publisher) connect(ctx context.Context) (<-chan struct{}, error) {
	seq, err := p.nextBirthSeq()
	if err != nil {
		return nil, err
	}
	death, err := proto.Marshal(&lifelinev1.NodeDeath{Node: p.cfg.Node, BirthSeq: seq})
	if err != nil {
		return nil, err
	}
	lost := make(chan struct{})
	var once sync.Once
	opts := mqtt.NewClientOptions().
		AddBroker(p.cfg.Broker).
		SetClientID("lifeline-agent-"+p.cfg.Node).
		SetUsername(p.cfg.Username).SetPassword(p.cfg.Password).
		SetCleanSession(true).
		SetAutoReconnect(false).
		SetConnectRetry(false).
		SetKeepAlive(5*time.Second).
		SetConnectTimeout(3*time.Second).
		SetWriteTimeout(p.cfg.AckTimeout).
		SetBinaryWill(p.topic(lifelinev1.KindDeath), death, 1, true).
		SetConnectionLostHandler(func(mqtt.Client, error) { once.Do(func() { close(lost) }) })
	if p.cfg.TLS != nil {
		opts.SetTLSConfig(p.cfg.TLS)
	}
	client := mqtt.NewClient(opts)
	if err := p.wait(client.Connect()); err != nil {
		return nil, fmt.Errorf("connecting to %s: %w", p.cfg.Broker, err)
	}
	birth, err := proto.Marshal(&lifelinev1.NodeBirth{Node: p.cfg.Node, BootId: p.cfg.BootID, BirthSeq: seq,
		AgentVersion: p.cfg.AgentVersion, TimeUnixNano: time.Now().UnixNano()})
	if err != nil {
		return nil, err
	}
	if err := p.wait(client.Publish(p.topic(lifelinev1.KindBirth), 1, true, birth)); err != nil {
		client.Disconnect(0)
		return nil, fmt.Errorf("publishing birth: %w", err)
	}
	if p.cfg.OnCommand != nil {
		topic := lifelinev1.AgentCommandTopic(p.cfg.Cluster, p.cfg.Node)
		handler := func(_ mqtt.Client, m mqtt.Message) { p.cfg.OnCommand(m.Payload()) }
		if err := p.wait(client.Subscribe(topic, 1, handler)); err != nil {
			client.Disconnect(0)
			return nil, fmt.Errorf("subscribing to %s: %w", topic, err)
		}
	}
	p.mu.Lock()
	p.client, p.birthSeq, p.connected = client, seq, true
	p.mu.Unlock()
	p.cfg.Log.V(2).Info("connected", "broker", p.cfg.Broker, "birthSeq", seq)
	return lost, nil
}

// drainUntilLost sends the journal in order, waiting for each acknowledgement, whenever there is something to
// send, until the session is lost or ctx ends.
func (p *Publisher) drainUntilLost(ctx context.Context, lost <-chan struct{}) {
	for {
		if err := p.drain(); err != nil {
			p.cfg.Log.V(2).Info("sending stopped", "error", err.Error())
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-lost:
			return
		case <-p.wake:
		case <-time.After(time.Second):
		}
	}
}

func (p *Publisher) drain() error {
	pending, err := p.journal.Pending()
	if err != nil {
		return err
	}
	p.mu.Lock()
	client := p.client
	p.mu.Unlock()
	for _, e := range pending {
		if err := p.wait(client.Publish(e.Topic, e.QoS, e.Retained, e.Payload)); err != nil {
			return fmt.Errorf("publishing %s: %w", e.Topic, err)
		}
		if err := p.journal.Ack(e.Seq); err != nil {
			return err
		}
	}
	return nil
}

// sayGoodbye publishes the death itself on a clean stop [P-DEATH-1].
func (p *Publisher) sayGoodbye(client mqtt.Client) {
	death, err := proto.Marshal(&lifelinev1.NodeDeath{Node: p.cfg.Node, BirthSeq: p.BirthSeq()})
	if err == nil {
		_ = p.wait(client.Publish(p.topic(lifelinev1.KindDeath), 1, true, death))
	}
}

func (p *Publisher) wait(t mqtt.Token) error {
	if !t.WaitTimeout(p.cfg.AckTimeout) {
		return errors.New("timed out waiting for the broker")
	}
	return t.Error()
}

func (p *Publisher) topic(k lifelinev1.Kind) string {
	return lifelinev1.NodeTopic(p.cfg.Cluster, p.cfg.Node, k).String()
}

// nextBirthSeq increments the birth sequence kept in the state directory.
func (p *Publisher) nextBirthSeq() (uint64, error) {
	path := filepath.Join(p.cfg.StateDir, "birth-seq")
	var seq uint64
	if data, err := os.ReadFile(path); err == nil {
		seq, _ = strconv.ParseUint(strings.TrimSpace(string(data)), 10, 64)
	} else if !os.IsNotExist(err) {
		return 0, fmt.Errorf("reading birth sequence: %w", err)
	}
	seq++
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(strconv.FormatUint(seq, 10)), 0o600); err != nil {
		return 0, fmt.Errorf("saving birth sequence: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return 0, fmt.Errorf("saving birth sequence: %w", err)
	}
	return seq, nil
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
