package scale

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/lifeline-edge/lifeline/cloud/contract"
	"github.com/lifeline-edge/lifeline/edge/agent"
	"github.com/lifeline-edge/lifeline/edge/journal"
	"github.com/lifeline-edge/lifeline/edge/publisher"
	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
)

// HeartbeatInterval is how often every simulated agent sends a heartbeat, as the real agent does by default.
const HeartbeatInterval = time.Second

// fleet plays the edge agents of many nodes over MQTT: each runs the agent's own publisher (birth, death as last
// will, journaled worker states) and heartbeat loop, and publishes its workers' states as the agent's observer
// would. What a real agent learns from the container runtime, a simulated one takes from the API server's pods.
type fleet struct {
	cluster string
	agents  map[string]*simAgent
	wg      sync.WaitGroup
	stop    context.CancelFunc
}

// simAgent is one node's agent.
type simAgent struct {
	cluster, node string
	pub           *publisher.Publisher
	reachable     atomic.Bool   // what its heartbeats say of the API server
	changed       chan struct{} // a heartbeat at once when reachable changes, as a real agent's probe asks

	mu      sync.Mutex // guards seq and running
	seq     uint64
	running map[types.UID]bool // pods whose Running state was published
}

// startFleet connects one agent per node to the broker at addr (host:port), each with the password in
// credentialsDir, as the controller's mounted Secret holds it.
func startFleet(ctx context.Context, addr, cluster, credentialsDir, stateDir string, nodes []string, log logr.Logger) (*fleet, error) {
	ctx, cancel := context.WithCancel(ctx)
	f := &fleet{cluster: cluster, agents: map[string]*simAgent{}, stop: cancel}
	for _, node := range nodes {
		password, err := os.ReadFile(filepath.Join(credentialsDir, node))
		if err != nil {
			cancel()
			return nil, fmt.Errorf("reading the MQTT password of %s: %w", node, err)
		}
		dir := filepath.Join(stateDir, node)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			cancel()
			return nil, fmt.Errorf("creating the agent state of %s: %w", node, err)
		}
		a := &simAgent{cluster: cluster, node: node, running: map[types.UID]bool{}, changed: make(chan struct{}, 1)}
		a.reachable.Store(true)
		a.pub = publisher.New(publisher.Config{Broker: "tcp://" + addr, Username: node, Password: string(password),
			Cluster: cluster, Node: node, AgentVersion: "scale", BootID: "boot-" + node, StateDir: dir,
			Log: log.WithValues("node", node)}, newMemJournal())
		f.agents[node] = a
		f.wg.Add(2)
		go func() { defer f.wg.Done(); a.pub.Run(ctx) }()
		go func() {
			defer f.wg.Done()
			agent.Heartbeats(ctx, cluster, node, HeartbeatInterval, a.pub, agent.HeartbeatFacts{APIReachable: a.reachable.Load, Changed: a.changed})
		}()
	}
	return f, nil
}

// setReachable says what the agent's probe of the API server finds: its next heartbeat, sent at once, tells it.
func (a *simAgent) setReachable(reachable bool) {
	if a.reachable.Swap(reachable) != reachable {
		select {
		case a.changed <- struct{}{}:
		default:
		}
	}
}

// Stop disconnects every agent, each leaving its death.
func (f *fleet) Stop() {
	f.stop()
	f.wg.Wait()
}

// connected counts the agents with a session up.
func (f *fleet) connected() int {
	n := 0
	for _, a := range f.agents {
		if a.pub.Connected() {
			n++
		}
	}
	return n
}

// attempts counts the sessions the fleet's agents have tried to open.
func (f *fleet) attempts() uint64 {
	var n uint64
	for _, a := range f.agents {
		n += a.pub.Attempts()
	}
	return n
}

// nodes lists the fleet's nodes in order.
func (f *fleet) nodes() []string {
	names := make([]string, 0, len(f.agents))
	for n := range f.agents {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// observe is what the agent of the pod's node does when its runtime shows one of the node's workers (a pod
// with Lifeline's role label, not a stand-in's mirror) running: it publishes the worker's Running state once per pod.
func (f *fleet) observe(pod *corev1.Pod) {
	a := f.agents[pod.Spec.NodeName]
	if _, worker := pod.Labels[contract.RoleLabel]; a == nil || !worker || contract.IsMirrorPod(pod) || pod.Status.Phase != corev1.PodRunning || pod.DeletionTimestamp != nil {
		return
	}
	a.mu.Lock()
	done := a.running[pod.UID]
	a.running[pod.UID] = true
	a.mu.Unlock()
	if !done {
		_ = a.publishState(pod, lifelinev1.Phase_PHASE_RUNNING)
	}
}

// publishState journals a worker state of pod, with the next seq, as the agent's observer does [P-WS-1]; a
// death starts an episode at its own seq [P-WS-3].
func (a *simAgent) publishState(pod *corev1.Pod, phase lifelinev1.Phase) error {
	a.mu.Lock()
	a.seq++
	seq := a.seq
	a.mu.Unlock()
	ws := &lifelinev1.WorkerState{Namespace: pod.Namespace, Name: pod.Name, Uid: string(pod.UID), Phase: phase,
		Seq: seq, BirthSeq: a.pub.BirthSeq(), ObservedUnixNano: time.Now().UnixNano()}
	for _, c := range pod.Spec.Containers {
		cs := &lifelinev1.ContainerState{Name: c.Name, Running: phase == lifelinev1.Phase_PHASE_RUNNING}
		if phase == lifelinev1.Phase_PHASE_FAILED {
			cs.ExitCode, cs.FinishedUnixNano = 1, time.Now().UnixNano()
			ws.LastExitCode = 1
		}
		ws.Containers = append(ws.Containers, cs)
	}
	if phase != lifelinev1.Phase_PHASE_RUNNING {
		ws.Episode = seq
	}
	payload, err := proto.Marshal(ws)
	if err != nil {
		return err
	}
	topic := lifelinev1.WorkerTopic(a.cluster, a.node, pod.Namespace, pod.Name).String()
	return a.pub.Enqueue(journal.Entry{Topic: topic, Payload: payload, QoS: 1, Retained: true,
		Key: pod.Namespace + "/" + pod.Name})
}

// publishReport journals a Sedna report of a worker, as the agent's report API does [P-REP-1].
func (a *simAgent) publishReport(namespace, worker string, body []byte) error {
	a.mu.Lock()
	a.seq++
	seq := a.seq
	a.mu.Unlock()
	payload, err := proto.Marshal(&lifelinev1.WorkerReport{Namespace: namespace, Worker: worker, Body: body, Seq: seq,
		BirthSeq: a.pub.BirthSeq(), ReceivedUnixNano: time.Now().UnixNano()})
	if err != nil {
		return err
	}
	return a.pub.Enqueue(journal.Entry{Topic: lifelinev1.NodeTopic(a.cluster, a.node, lifelinev1.KindReport).String(),
		Payload: payload, QoS: 1})
}

// memJournal is the publisher's journal in memory: a thousand agents in one process need no thousand bbolt
// files, and what is measured is the controller, not the agents' disks. It keeps the journal's contract: entries
// in order, a keyed entry replacing a pending one with the same key.
type memJournal struct {
	mu      sync.Mutex
	next    uint64
	entries []journal.Entry
}

func newMemJournal() *memJournal { return &memJournal{} }

func (j *memJournal) Put(e journal.Entry) (uint64, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.next++
	e.Seq = j.next
	if e.Key != "" {
		for i, old := range j.entries {
			if old.Key == e.Key {
				j.entries = append(j.entries[:i], j.entries[i+1:]...)
				break
			}
		}
	}
	j.entries = append(j.entries, e)
	return e.Seq, nil
}

func (j *memJournal) Pending() ([]journal.Entry, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	return append([]journal.Entry(nil), j.entries...), nil
}

func (j *memJournal) PendingKeyed() ([]journal.Entry, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	var out []journal.Entry
	for _, e := range j.entries {
		if e.Key != "" {
			out = append(out, e)
		}
	}
	return out, nil
}

func (j *memJournal) PendingLog(after uint64, limit int) ([]journal.Entry, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	var out []journal.Entry
	for _, e := range j.entries {
		if e.Key == "" && e.Seq > after && len(out) < limit {
			out = append(out, e)
		}
	}
	return out, nil
}

func (j *memJournal) Ack(seq uint64) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	for i, e := range j.entries {
		if e.Seq == seq {
			j.entries = append(j.entries[:i], j.entries[i+1:]...)
			break
		}
	}
	return nil
}
