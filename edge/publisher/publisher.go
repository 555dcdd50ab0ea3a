// Package publisher is the edge agent's MQTT session: it announces the node with a retained birth, leaves a
// retained death as its last will, and sends journaled messages in order, removing each from the journal only
// once the broker acknowledged it. A broken session is replaced by a new one with the next birth sequence.
package publisher

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/go-logr/logr"
	"google.golang.org/protobuf/proto"

	"github.com/lifeline-edge/lifeline/edge/journal"
	"github.com/lifeline-edge/lifeline/edge/statefile"
	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
)

// Journal is what the publisher needs of the journal.
type Journal interface {
	Put(journal.Entry) (uint64, error)
	PendingKeyed() ([]journal.Entry, error)
	PendingLog(after uint64, limit int) ([]journal.Entry, error)
	Ack(seq uint64) error
}

// replayPage is how many log entries are read from the journal at once: at most a few MiB of reports in memory
// (each at most lifelinev1.MaxReportBodyBytes), and the workers' states checked again between pages.
const replayPage = 32

// Config configures the session.
type Config struct {
	// Broker is the broker's URL: tcp://host:port or ssl://host:port.
	Broker             string
	Username, Password string
	TLS                *tls.Config
	Cluster, Node      string
	AgentVersion       string
	BootID             string
	// HeartbeatInterval is said in every birth, so the controller knows when the node is silent [P-HB-3].
	HeartbeatInterval time.Duration
	// APIReachable, when set, says in every birth whether the node reaches the API server, so the controller
	// does not keep the previous session's word until the first heartbeat [P-HB-1]; a birth before the agent
	// knows (known false: just started) says nothing.
	APIReachable func() (reachable, known bool)
	// StateDir keeps the birth sequence across restarts [P-BIRTH-2].
	StateDir string
	// RetryInterval is the mean wait after the first failed connection attempt (default 1 s); it doubles with
	// each further failure up to MaxRetryInterval (default 15 s), and each wait is drawn between half and one and
	// a half of it, so a thousand nodes that lost the broker together (a controller restart) neither come back in
	// the same instant nor keep a thousand TLS handshakes a second going while it is away.
	RetryInterval, MaxRetryInterval time.Duration
	// AckTimeout is how long an acknowledgement may take before the wait for it is logged (default 5 s), and
	// bounds the wait for the death a clean stop publishes. A slow acknowledgement never ends the session: the
	// keepalive tells a dead link, and a new session would only add its birth and replay to an overloaded broker.
	AckTimeout time.Duration
	// OnCommand, when set, receives the payload of every message on the node's commands topic.
	OnCommand func(payload []byte)
	// OnDesired, when set, receives the payload of every message on the node's desired topic, with the birth
	// sequence of the session it arrived in [P-DES-2].
	OnDesired func(birthSeq uint64, payload []byte)
	Log       logr.Logger
	// Now, when set, is the clock a birth sequence is seeded from when its file does not parse.
	Now func() time.Time
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
	id        string // the state directory's id; touched by Run's goroutine only

	attempts atomic.Uint64 // sessions tried, for Attempts
}

// Attempts counts the sessions the publisher has tried to open: what its back-off bounds, the broker's load when
// a fleet reconnects at once.
func (p *Publisher) Attempts() uint64 { return p.attempts.Load() }

// New returns a publisher; Run connects it.
func New(cfg Config, j Journal) *Publisher {
	if cfg.RetryInterval == 0 {
		cfg.RetryInterval = time.Second
	}
	if cfg.MaxRetryInterval < cfg.RetryInterval {
		cfg.MaxRetryInterval = max(15*time.Second, cfg.RetryInterval)
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
	retry := backoff{base: p.cfg.RetryInterval, max: p.cfg.MaxRetryInterval}
	for ctx.Err() == nil {
		p.attempts.Add(1)
		lost, err := p.connect(ctx)
		if err != nil {
			wait := jittered(retry.next())
			p.cfg.Log.V(2).Info("broker unreachable", "broker", p.cfg.Broker, "error", err.Error(), "retryIn", wait)
			sleep(ctx, wait)
			continue
		}
		retry.reset()
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
	stateID, err := p.stateID()
	if err != nil {
		return nil, err
	}
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
		SetClientID(lifelinev1.AgentClientID(p.cfg.Node)).
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
		AgentVersion: p.cfg.AgentVersion, TimeUnixNano: time.Now().UnixNano(), StateId: stateID,
		HeartbeatIntervalMillis: uint32(p.cfg.HeartbeatInterval.Milliseconds()), ApiReachable: p.apiReachable()})
	if err != nil {
		return nil, err
	}
	// The controller answers a birth with the node's desired workers [P-DES-1]: the subscriptions come first.
	if err := p.subscribe(ctx, client, seq, lost); err != nil {
		client.Disconnect(0)
		return nil, err
	}
	if err := p.waitAcked(ctx, client.Publish(p.topic(lifelinev1.KindBirth), 1, true, birth), lost); err != nil {
		client.Disconnect(0)
		return nil, fmt.Errorf("publishing birth: %w", err)
	}
	p.mu.Lock()
	p.client, p.birthSeq, p.connected = client, seq, true
	p.mu.Unlock()
	p.cfg.Log.V(2).Info("connected", "broker", p.cfg.Broker, "birthSeq", seq)
	return lost, nil
}

// subscribe subscribes the session of birth seq to the node's commands and desired sets, for those of the
// handlers that are set.
func (p *Publisher) subscribe(ctx context.Context, client mqtt.Client, seq uint64, lost <-chan struct{}) error {
	handlers := map[string]mqtt.MessageHandler{}
	if p.cfg.OnCommand != nil {
		handlers[lifelinev1.AgentCommandTopic(p.cfg.Cluster, p.cfg.Node)] = func(_ mqtt.Client, m mqtt.Message) { p.cfg.OnCommand(m.Payload()) }
	}
	if p.cfg.OnDesired != nil {
		handlers[lifelinev1.AgentDesiredTopic(p.cfg.Cluster, p.cfg.Node)] = func(_ mqtt.Client, m mqtt.Message) { p.cfg.OnDesired(seq, m.Payload()) }
	}
	for topic, handler := range handlers {
		if err := p.waitAcked(ctx, client.Subscribe(topic, 1, handler), lost); err != nil {
			return fmt.Errorf("subscribing to %s: %w", topic, err)
		}
	}
	return nil
}

// drainUntilLost sends the journal in order, waiting for each acknowledgement, whenever there is something to
// send, until the session is lost or ctx ends.
func (p *Publisher) drainUntilLost(ctx context.Context, lost <-chan struct{}) {
	for {
		if err := p.drain(ctx, lost); err != nil {
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

// drain sends what the journal holds: the workers' latest states first, then the log of reports a page at a
// time, going back to the states between pages, so a state is never queued behind a long replay of reports.
func (p *Publisher) drain(ctx context.Context, lost <-chan struct{}) error {
	p.mu.Lock()
	client := p.client
	p.mu.Unlock()
	var after uint64 // the last log entry sent
	for {
		states, err := p.journal.PendingKeyed()
		if err != nil {
			return err
		}
		reports, err := p.journal.PendingLog(after, replayPage)
		if err != nil {
			return err
		}
		if len(states) == 0 && len(reports) == 0 {
			return nil
		}
		for _, e := range append(states, reports...) {
			if err := p.waitAcked(ctx, client.Publish(e.Topic, e.QoS, e.Retained, e.Payload), lost); err != nil {
				return fmt.Errorf("publishing %s: %w", e.Topic, err)
			}
			if err := p.journal.Ack(e.Seq); err != nil {
				return err
			}
		}
		if len(reports) > 0 {
			after = reports[len(reports)-1].Seq
		}
	}
}

// sayGoodbye publishes the death itself on a clean stop [P-DEATH-1].
func (p *Publisher) sayGoodbye(client mqtt.Client) {
	death, err := proto.Marshal(&lifelinev1.NodeDeath{Node: p.cfg.Node, BirthSeq: p.BirthSeq()})
	if err == nil {
		_ = p.wait(client.Publish(p.topic(lifelinev1.KindDeath), 1, true, death))
	}
}

// waitAcked waits for t as long as the session lives, logging once when the broker is slower than AckTimeout.
func (p *Publisher) waitAcked(ctx context.Context, t mqtt.Token, lost <-chan struct{}) error {
	slow := time.NewTimer(p.cfg.AckTimeout)
	defer slow.Stop()
	for {
		select {
		case <-t.Done():
			return t.Error()
		case <-lost:
			return errors.New("session lost before the broker acknowledged")
		case <-ctx.Done():
			return ctx.Err()
		case <-slow.C:
			p.cfg.Log.V(2).Info("broker slow to acknowledge; waiting on", "after", p.cfg.AckTimeout)
		}
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

// nextBirthSeq increments the birth sequence kept in the state directory, durably (file and directory synced)
// before the birth that uses it goes out [P-BIRTH-2]. A file that does not parse is moved aside and the
// sequence starts again from the wall clock in milliseconds, above any count of connections an earlier life
// could have made.
func (p *Publisher) nextBirthSeq() (uint64, error) {
	path := filepath.Join(p.cfg.StateDir, "birth-seq")
	var seq uint64
	data, err := os.ReadFile(path)
	switch {
	case os.IsNotExist(err):
	case err != nil:
		return 0, fmt.Errorf("reading birth sequence %s: %w", path, err)
	default:
		var perr error
		if seq, perr = strconv.ParseUint(strings.TrimSpace(string(data)), 10, 64); perr != nil {
			aside := fmt.Sprintf("%s.corrupt-%s", path, p.now().UTC().Format("20060102T150405.000000000Z"))
			if err := os.Rename(path, aside); err != nil {
				return 0, fmt.Errorf("moving the unparsable birth sequence %s aside: %w", path, err)
			}
			seq = uint64(p.now().UnixMilli())
			p.cfg.Log.Error(perr, "the birth sequence on disk does not parse; moved aside, seeded from the clock",
				"path", path, "movedTo", aside, "birthSeq", seq+1)
		}
	}
	seq++
	if err := statefile.Write(path, []byte(strconv.FormatUint(seq, 10))); err != nil {
		return 0, fmt.Errorf("saving birth sequence %s: %w", path, err)
	}
	return seq, nil
}

// stateID returns the random id of the state directory, creating it with the directory's first birth: a new
// one means the journal, counters and birth sequence started anew, so the controller starts a new epoch of
// the node whatever the birth sequence says [P-BIRTH-3].
func (p *Publisher) stateID() (string, error) {
	if p.id != "" {
		return p.id, nil
	}
	path := filepath.Join(p.cfg.StateDir, "state-id")
	data, err := os.ReadFile(path)
	if err == nil && validStateID(strings.TrimSpace(string(data))) {
		p.id = strings.TrimSpace(string(data))
		return p.id, nil
	}
	if err != nil && !os.IsNotExist(err) {
		return "", fmt.Errorf("reading state id %s: %w", path, err)
	}
	if err == nil {
		p.cfg.Log.Info("the state id on disk is not one; starting a new state epoch", "path", path)
	}
	raw := make([]byte, 16)
	if _, err := rand.Read(raw); err != nil {
		return "", fmt.Errorf("creating a state id: %w", err)
	}
	id := hex.EncodeToString(raw)
	if err := statefile.Write(path, []byte(id)); err != nil {
		return "", fmt.Errorf("saving state id %s: %w", path, err)
	}
	p.id = id
	return id, nil
}

// validStateID tells whether s is an id stateID makes: 32 lowercase hex digits.
func validStateID(s string) bool {
	if len(s) != 32 {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil && strings.ToLower(s) == s
}

// apiReachable is the birth's api_reachable: unset when the publisher was given no way to know.
func (p *Publisher) apiReachable() *bool {
	if p.cfg.APIReachable == nil {
		return nil
	}
	v, known := p.cfg.APIReachable()
	if !known {
		return nil
	}
	return &v
}

func (p *Publisher) now() time.Time {
	if p.cfg.Now != nil {
		return p.cfg.Now()
	}
	return time.Now()
}

// backoff is the mean wait before each next connection attempt: base after the first failure, doubling after
// each further one up to max, base again once a session was up.
type backoff struct {
	base, max, cur time.Duration
}

func (b *backoff) next() time.Duration {
	if b.cur == 0 {
		b.cur = b.base
	}
	d := b.cur
	b.cur = min(2*b.cur, b.max)
	return d
}

func (b *backoff) reset() { b.cur = 0 }

// jittered is d scaled by a factor drawn uniformly from [0.5, 1.5).
func jittered(d time.Duration) time.Duration {
	return d/2 + mrand.N(d)
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// BootID identifies this boot of the node, so the controller can tell a node reboot from an agent restart.
func BootID() string {
	data, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(data))
}
