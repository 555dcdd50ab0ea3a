package desiredsets

import (
	"context"
	"crypto/sha256"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"

	"github.com/lifeline-edge/lifeline/cloud/liveness"
)

// Publisher sends a node's agent its set over the broker session.
type Publisher interface {
	PublishDesired(node string, payload []byte) error
}

// Agents is the liveness table's word on a node's agent: a set goes only to an agent in session, and answers
// that session's birth [P-DES-2].
type Agents interface {
	AgentOf(node string, now time.Time) liveness.AgentState
}

// NodePods lists the pods bound to a node whole, as the API server has them: the controller's cache keeps of a
// pod only what its reconciles read, not the spec a stand-in needs.
type NodePods interface {
	NodeWorkers(ctx context.Context, node string) ([]corev1.Pod, error)
}

// Sender sends each edge node's agent its set when the agent begins a session and whenever the set changes. It
// is a manager runnable; Enqueue is safe before it starts.
type Sender struct {
	Out    Publisher
	Agents Agents
	Pods   NodePods
	Log    logr.Logger
	// Now is the clock revisions are drawn from (time.Now when nil).
	Now func() time.Time
	// PodChangeBatch is how long a pod's change waits for the other changes of its node before the node's set is
	// rendered (0: not at all). A worker's bind, its start and its node's other new workers come in bursts, and
	// each rendering lists the node's pods from the API server. A session's birth never waits.
	PodChangeBatch time.Duration
	// Clock drives PodChangeBatch's waits (the real clock when nil).
	Clock clock.WithTicker

	once  sync.Once
	queue workqueue.TypedRateLimitingInterface[string]

	mu   sync.Mutex
	sent map[string]sentSet // by node: what the node's agent was last sent
}

// sentSet is what a node's agent was last sent: for which session, which set (its digest) and under which
// revision.
type sentSet struct {
	birthSeq uint64
	digest   [sha256.Size]byte
	revision uint64
}

// workers is how many nodes' sets are rendered at once: each lists a node's pods from the API server.
const workers = 2

func (s *Sender) init() {
	s.once.Do(func() {
		s.queue = workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "desired-sets", Clock: s.Clock})
		s.sent = map[string]sentSet{}
		if s.Now == nil {
			s.Now = time.Now
		}
	})
}

// Enqueue asks for node's set to be sent again if it changed, or if its agent began a session since.
func (s *Sender) Enqueue(node string) {
	if node == "" {
		return
	}
	s.init()
	s.queue.Add(node)
}

// enqueuePodChange asks for node's set to be rendered once PodChangeBatch has passed: the node's changes in the
// meantime are rendered with it.
func (s *Sender) enqueuePodChange(node string) {
	if node == "" {
		return
	}
	s.init()
	s.queue.AddAfter(node, s.PodChangeBatch)
}

// Start sends sets until ctx ends.
func (s *Sender) Start(ctx context.Context) error {
	s.init()
	go func() { <-ctx.Done(); s.queue.ShutDown() }()
	go s.recheckSent(ctx)
	var running sync.WaitGroup
	for range workers {
		running.Go(func() {
			for s.next(ctx) {
			}
		})
	}
	running.Wait()
	return nil
}

// NeedLeaderElection: one controller holds the broker session; its sets are the only ones.
func (s *Sender) NeedLeaderElection() bool { return true }

func (s *Sender) next(ctx context.Context) bool {
	node, shutdown := s.queue.Get()
	if shutdown {
		return false
	}
	defer s.queue.Done(node)
	if err := s.sync(ctx, node); err != nil {
		s.Log.V(1).Info("sending a node's desired workers; retrying", "node", node, "error", err.Error())
		s.queue.AddRateLimited(node)
		return true
	}
	s.queue.Forget(node)
	return true
}

// sync sends node's agent its set unless its session already has this one.
func (s *Sender) sync(ctx context.Context, node string) error {
	now := s.Now()
	agent := s.Agents.AgentOf(node, now)
	if !agent.Heard || agent.Stopped {
		s.forget(node)
		return nil // no session to send to: its next birth asks again
	}
	pods, err := s.Pods.NodeWorkers(ctx, node)
	if err != nil {
		return fmt.Errorf("listing the pods of node %s: %w", node, err)
	}
	set := renderSet(node, pods)
	rendered, err := proto.Marshal(set)
	if err != nil {
		return fmt.Errorf("encoding the desired workers of node %s: %w", node, err)
	}
	digest := sha256.Sum256(rendered)
	s.mu.Lock()
	last := s.sent[node]
	s.mu.Unlock()
	if last.birthSeq == agent.BirthSeq && last.digest == digest {
		return nil
	}
	set.BirthSeq, set.Revision = agent.BirthSeq, nextRevision(last.revision, now)
	payload, err := proto.Marshal(set)
	if err == nil {
		err = s.Out.PublishDesired(node, payload)
	}
	if err != nil {
		return fmt.Errorf("sending node %s its desired workers: %w", node, err)
	}
	s.mu.Lock()
	s.sent[node] = sentSet{birthSeq: set.BirthSeq, digest: digest, revision: set.Revision}
	s.mu.Unlock()
	s.Log.V(1).Info("sent a node its desired workers", "node", node, "birthSeq", set.BirthSeq, "revision", set.Revision,
		"workers", len(set.Workers), "bytes", len(payload))
	return nil
}

// nextRevision is the clock's nanoseconds, and at least one more than the last: revisions grow across the
// controller's restarts and a change of leader, which an external broker's session outlives [P-DES-2].
func nextRevision(last uint64, now time.Time) uint64 {
	return max(uint64(now.UnixNano()), last+1)
}

// recheckSentEvery is how often every node sent a set is looked at again: one whose agent the liveness table
// forgot (its Node gone) is forgotten here too, so what the sender keeps is bounded by the nodes heard.
const recheckSentEvery = time.Minute

func (s *Sender) recheckSent(ctx context.Context) {
	tick := time.NewTicker(recheckSentEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			s.mu.Lock()
			for node := range s.sent {
				if !s.Agents.AgentOf(node, now).Heard {
					delete(s.sent, node)
				}
			}
			s.mu.Unlock()
		}
	}
}

func (s *Sender) forget(node string) {
	s.mu.Lock()
	delete(s.sent, node)
	s.mu.Unlock()
}
