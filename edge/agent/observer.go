// Package agent holds the edge agent's loops: the observer that turns what the container runtime shows into
// worker states, published the moment they change.
package agent

import (
	"context"
	"encoding/json"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/protobuf/proto"

	"github.com/lifeline-edge/lifeline/edge/cri"
	"github.com/lifeline-edge/lifeline/edge/journal"
	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
)

// WorkerSource is what the observer reads: the pods the container runtime has.
type WorkerSource interface {
	Pods(ctx context.Context) ([]cri.Pod, error)
}

// Publisher takes messages for the broker.
type Publisher interface {
	Enqueue(journal.Entry) error
	BirthSeq() uint64
}

// Counter hands out sequence numbers that grow across restarts.
type Counter interface {
	NextCounter(name string) (uint64, error)
}

// ValueStore keeps small values across restarts.
type ValueStore interface {
	Value(key string) ([]byte, error)
	SetValue(key string, v []byte) error
}

// Observer publishes a worker's state whenever it changes [P-WS-1].
type Observer struct {
	Cluster, Node string
	Source        WorkerSource
	Publisher     Publisher
	Seq           Counter
	// Interval between polls of the runtime (default 500 ms).
	Interval time.Duration
	// Changed, when set, signals a change the runtime announced (a container event): the runtime is read at
	// once instead of at the next poll.
	Changed <-chan struct{}
	// IsWorker selects the pods that are Lifeline workers; nil selects every pod.
	IsWorker func(cri.Pod) bool
	// OnPublished, when set, is told each state as it is published, before it can reach the controller (commands
	// are fenced against it, so one decided on this state finds it known).
	OnPublished func(*lifelinev1.WorkerState)
	// OnForgotten, when set, is told of a worker the observer forgot: gone, and no longer one of the node's.
	OnForgotten func(namespace, name string)
	// Completes, when set, tells whether a worker's exit 0 is its completion (its pod's restartPolicy is
	// OnFailure or Never); nil: never (Always, the default).
	Completes func(uid string) bool
	// Store, when set, keeps the workers' episodes across agent restarts (the journal), so a restarted agent
	// continues a death's episode and the controller does not command it again.
	Store ValueStore
	Log   logr.Logger

	last      map[string]*lifelinev1.WorkerState // by namespace/name; touched by Run's goroutine only
	lastBirth uint64                             // the session the states in last were published in
	// episodes outlive sessions: a reconnect publishes every state again, but a death stays one episode.
	episodes map[string]episode // by namespace/name
}

// Run polls until ctx ends.
func (o *Observer) Run(ctx context.Context) {
	interval := o.Interval
	if interval == 0 {
		interval = 500 * time.Millisecond
	}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		if err := o.ObserveOnce(ctx); err != nil {
			o.Log.V(2).Info("observing the runtime", "error", err.Error())
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-o.Changed:
		}
	}
}

// ObserveOnce reads the runtime and publishes what changed since the last call, including workers that are gone.
func (o *Observer) ObserveOnce(ctx context.Context) error {
	pods, err := o.Source.Pods(ctx)
	if err != nil {
		return err
	}
	// A new session (a reconnect, perhaps to a restarted controller with an empty table) gets every state
	// again, not only what changes next.
	if birth := o.Publisher.BirthSeq(); o.last == nil || birth != o.lastBirth {
		o.last, o.lastBirth = map[string]*lifelinev1.WorkerState{}, birth
	}
	seen := map[string]bool{}
	for _, p := range pods {
		if o.IsWorker != nil && !o.IsWorker(p) {
			continue
		}
		key := p.Namespace + "/" + p.Name
		seen[key] = true
		if err := o.publishIfChanged(key, workerState(p)); err != nil {
			return err
		}
	}
	for key, prev := range o.last {
		switch {
		case seen[key]:
		case prev.Phase == lifelinev1.Phase_PHASE_SUCCEEDED && o.Completes != nil && o.Completes(prev.Uid):
			// A worker that completed and whose containers the node then removed (its pod deleted, perhaps while
			// the agent still holds it as cut off) is finished, not lost: it keeps its last state, and nothing
			// rebuilds it.
			if o.IsWorker != nil && !o.IsWorker(cri.Pod{Namespace: prev.Namespace, Name: prev.Name, UID: prev.Uid}) {
				if err := o.forget(key, prev); err != nil {
					return err
				}
			}
		case prev.Phase != lifelinev1.Phase_PHASE_GONE:
			gone := &lifelinev1.WorkerState{Namespace: prev.Namespace, Name: prev.Name, Uid: prev.Uid, Phase: lifelinev1.Phase_PHASE_GONE}
			if err := o.publishIfChanged(key, gone); err != nil {
				return err
			}
		case o.IsWorker != nil && !o.IsWorker(cri.Pod{Namespace: prev.Namespace, Name: prev.Name, UID: prev.Uid}):
			if err := o.forget(key, prev); err != nil {
				return err
			}
		}
	}
	return nil
}

// forget drops a worker that is gone and no longer one of the node's workers, so the maps hold the node's
// workers only, and clears its retained state, so the broker's retained states are the node's workers only
// [P-WS-4].
func (o *Observer) forget(key string, prev *lifelinev1.WorkerState) error {
	topic := lifelinev1.WorkerTopic(o.Cluster, o.Node, prev.Namespace, prev.Name).String()
	if err := o.Publisher.Enqueue(journal.Entry{Topic: topic, QoS: 1, Retained: true, Key: key}); err != nil {
		return err
	}
	delete(o.last, key)
	delete(o.episodes, key)
	o.saveEpisode(key, nil)
	if o.OnForgotten != nil {
		o.OnForgotten(prev.Namespace, prev.Name)
	}
	return nil
}

func (o *Observer) publishIfChanged(key string, ws *lifelinev1.WorkerState) error {
	if prev := o.last[key]; prev != nil && sameState(prev, ws) {
		return nil
	}
	seq, err := o.Seq.NextCounter("worker-state")
	if err != nil {
		return err
	}
	prev, known := o.episode(key)
	ep := nextEpisode(prev, known, ws, seq)
	ws.Seq, ws.BirthSeq, ws.ObservedUnixNano, ws.Episode = seq, o.Publisher.BirthSeq(), time.Now().UnixNano(), ep.Seq
	payload, err := proto.Marshal(ws)
	if err != nil {
		return err
	}
	// Told before it is sent: a command the controller decides on this state must find it known here.
	if o.OnPublished != nil {
		o.OnPublished(ws)
	}
	topic := lifelinev1.WorkerTopic(o.Cluster, o.Node, ws.Namespace, ws.Name).String()
	if err := o.Publisher.Enqueue(journal.Entry{Topic: topic, Payload: payload, QoS: 1, Retained: true, Key: key}); err != nil {
		return err // not kept in o.last: the next pass publishes the worker's state again, with a new seq
	}
	o.last[key] = ws
	if ep != prev {
		o.saveEpisode(key, &ep)
	}
	o.episodes[key] = ep
	return nil
}

// episode is the worker's current episode, from memory or, first after a restart, from the store.
func (o *Observer) episode(key string) (episode, bool) {
	if o.episodes == nil {
		o.episodes = map[string]episode{}
	}
	if ep, ok := o.episodes[key]; ok || o.Store == nil {
		return ep, ok
	}
	var ep episode
	data, err := o.Store.Value(episodeKey(key))
	if err != nil || data == nil || json.Unmarshal(data, &ep) != nil {
		return episode{}, false
	}
	return ep, true
}

// saveEpisode keeps ep (nil: forgets it) in the store. A failure costs only the episode's continuity across a
// restart of the agent, so it is logged, not returned.
func (o *Observer) saveEpisode(key string, ep *episode) {
	if o.Store == nil {
		return
	}
	var data []byte
	if ep != nil {
		data, _ = json.Marshal(ep)
	}
	if err := o.Store.SetValue(episodeKey(key), data); err != nil {
		o.Log.Error(err, "keeping a worker's episode", "worker", key)
	}
}

func episodeKey(worker string) string { return "episode/" + worker }

// workerState summarises a pod as the runtime shows it.
func workerState(p cri.Pod) *lifelinev1.WorkerState {
	ws := &lifelinev1.WorkerState{Namespace: p.Namespace, Name: p.Name, Uid: p.UID}
	running, failed, exited := false, false, 0
	var lastFinished time.Time
	for _, c := range p.Containers {
		cs := &lifelinev1.ContainerState{Name: c.Name, Running: c.Running, Restarts: int32(c.Attempt), ExitCode: c.ExitCode}
		if !c.StartedAt.IsZero() {
			cs.StartedUnixNano = c.StartedAt.UnixNano()
		}
		if !c.FinishedAt.IsZero() {
			cs.FinishedUnixNano = c.FinishedAt.UnixNano()
		}
		ws.Containers = append(ws.Containers, cs)
		ws.Restarts += int32(c.Attempt)
		running = running || c.Running
		if c.Exited {
			exited++
			failed = failed || c.ExitCode != 0
			if !c.FinishedAt.Before(lastFinished) {
				lastFinished, ws.LastExitCode = c.FinishedAt, c.ExitCode
			}
		}
	}
	switch {
	case running:
		ws.Phase = lifelinev1.Phase_PHASE_RUNNING
	case exited > 0 && exited == len(p.Containers) && failed:
		ws.Phase = lifelinev1.Phase_PHASE_FAILED
	case exited > 0 && exited == len(p.Containers):
		ws.Phase = lifelinev1.Phase_PHASE_SUCCEEDED
	default:
		ws.Phase = lifelinev1.Phase_PHASE_PENDING
	}
	return ws
}

// sameState compares what a receiver cares about, not the observation time or sequence numbers.
func sameState(a, b *lifelinev1.WorkerState) bool {
	x, y := proto.Clone(a).(*lifelinev1.WorkerState), proto.Clone(b).(*lifelinev1.WorkerState)
	for _, ws := range []*lifelinev1.WorkerState{x, y} {
		ws.Seq, ws.BirthSeq, ws.ObservedUnixNano, ws.Episode = 0, 0, 0, 0
	}
	return proto.Equal(x, y)
}
