// Package agent runs the edge agent's decisions (package core) against the node: it reads the container
// runtime, takes the controller's commands and ticks, hands each to the core, and executes the actions the core
// returns against the runtime, the journal and the MQTT session, one at a time, in one goroutine. It knows the
// parts it acts through only by the small interfaces below (Actuator, Rebuilder, Armer, LoopProbe, ...): they are
// packages of their own (edge/restart, edge/standin, edge/health) that never import it, chosen by
// cmd/lifeline-agent.
package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/protobuf/proto"

	"github.com/lifeline-edge/lifeline/edge/agent/core"
	"github.com/lifeline-edge/lifeline/edge/cri"
	"github.com/lifeline-edge/lifeline/edge/desired"
	"github.com/lifeline-edge/lifeline/edge/journal"
	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
)

// WorkerSource is what the agent observes: the pods the container runtime has.
type WorkerSource interface {
	Pods(ctx context.Context) ([]cri.Pod, error)
}

// DesiredWorkers are the workers that belong on the node.
type DesiredWorkers interface {
	Workers() []desired.Worker
}

// Publisher takes messages for the broker.
type Publisher interface {
	Enqueue(journal.Entry) error
	BirthSeq() uint64
}

// Actuator restarts a worker's containers (ACTION_RESTART); the node starts them again.
type Actuator interface {
	Restart(ctx context.Context, namespace, pod, uid string) error
}

// Rebuilder runs a worker again from its last known pod when the node will never run it again (a stand-in), and
// gives the worker back to its own pod, or its replacement, once that runs.
type Rebuilder interface {
	Rebuild(ctx context.Context, namespace, pod, uid string) error
	// StandIns are the stand-ins in the node's directory, of this life of the agent or an earlier one.
	StandIns() ([]core.StandIn, error)
	// Release removes the stand-in of the pod namespace/pod; one already gone is no error.
	Release(namespace, pod string) error
}

// Armer writes stand-ins ahead while the node reaches the API server (standin.StaticPods.Arm), so that a
// rebuild needs nothing from the cloud.
type Armer interface {
	Arm(ctx context.Context, workers []desired.Worker) error
}

// Store keeps what the agent's decisions need across its restarts: the journal.
type Store interface {
	// NextCounter and AdvanceCounter keep the worker-state seq growing across restarts [P-WS-2].
	NextCounter(name string) (uint64, error)
	AdvanceCounter(name string, to uint64) error
	// ClaimCommand records an executed command id until its expiry [P-CMD-3].
	ClaimCommand(id string, forgetAfter, now time.Time) (bool, error)
	// Value and SetValue keep the workers' episodes.
	Value(key string) ([]byte, error)
	SetValue(key string, v []byte) error
}

// Config is what an agent is built from; cmd/lifeline-agent fills it from its flags.
type Config struct {
	Cluster, Node string
	Source        WorkerSource
	Workers       DesiredWorkers
	Publisher     Publisher
	// Store, when nil, keeps everything in memory for the life of the process (tests).
	Store    Store
	Actuator Actuator
	// Rebuilder, when nil, never rebuilds: ACTION_REBUILD is answered OUTCOME_FAILED and the offline policy
	// only reports.
	Rebuilder Rebuilder
	// APIReachable tells whether the node reaches the API server now; BrokerUp whether the MQTT session is up
	// (nil: never).
	APIReachable func() bool
	BrokerUp     func() bool
	Timing       core.HealTiming
	// Interval between reads of the runtime and ticks of the offline policy (default 500 ms).
	Interval time.Duration
	// Changed, when set, signals a change the runtime announced (a container event): the runtime is read at
	// once instead of at the next poll.
	Changed <-chan struct{}
	// Now is the agent's clock (default time.Now).
	Now func() time.Time
	Log logr.Logger
	// Probe, when set, hears the loop's turns and its reads of the runtime, which the agent's health probes
	// judge it by (health.Monitor.AgentLoop).
	Probe LoopProbe
}

// LoopProbe hears what the agent's health probes judge its loop by.
type LoopProbe interface {
	// Turned: the loop made progress (it turned, or ended an action).
	Turned()
	// RuntimeRead: a read of the runtime ended; err is nil when the runtime answered.
	RuntimeRead(err error)
}

// Agent is the loop that owns the core.
type Agent struct {
	cfg      Config
	core     *core.Core
	commands chan []byte
	stopped  chan struct{}
	restored map[string]bool // workers whose kept episode was offered to the core
	// armFailure is the last error arming stand-ins logged: a failure that persists is logged once, not at
	// every tick.
	armFailure string

	offlineRebuilds atomic.Uint64
}

// OfflineRebuilds is how many workers the agent rebuilt by their offline policy since it started.
func (a *Agent) OfflineRebuilds() uint64 { return a.offlineRebuilds.Load() }

// actionTimeout bounds a restart or a rebuild: the loop that observes the node waits for it.
const actionTimeout = 15 * time.Second

// stateCounter names the worker-state seq in the store.
const stateCounter = "worker-state"

// New builds an agent; the first worker-state seq is taken from the store, so it grows across restarts.
func New(cfg Config) (*Agent, error) {
	if cfg.Interval == 0 {
		cfg.Interval = 500 * time.Millisecond
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	first := uint64(1)
	if cfg.Store != nil {
		var err error
		if first, err = cfg.Store.NextCounter(stateCounter); err != nil {
			return nil, fmt.Errorf("reading the worker-state sequence: %w", err)
		}
	}
	return &Agent{cfg: cfg, core: core.New(core.Config{Timing: cfg.Timing, CanRebuild: cfg.Rebuilder != nil, FirstSeq: first}),
		commands: make(chan []byte, 64), stopped: make(chan struct{}), restored: map[string]bool{}}, nil
}

// Run reads the runtime and ticks every interval (and reads it at once on a container event), and executes
// commands as they arrive, until ctx ends.
func (a *Agent) Run(ctx context.Context) {
	defer close(a.stopped)
	tick := time.NewTicker(a.cfg.Interval)
	defer tick.Stop()
	observe := func() {
		if err := a.ObserveOnce(ctx); err != nil {
			a.cfg.Log.V(2).Info("observing the runtime", "error", err.Error())
		}
	}
	observe()
	for {
		a.turned()
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			observe()
			a.TickOnce(ctx)
		case <-a.cfg.Changed:
			observe()
		case payload := <-a.commands:
			if err := a.CommandOnce(ctx, payload); err != nil {
				a.cfg.Log.Error(err, "command")
			}
		}
	}
}

// turned tells the probe the loop made progress.
func (a *Agent) turned() {
	if a.cfg.Probe != nil {
		a.cfg.Probe.Turned()
	}
}

// HandleCommand queues a command payload for the loop (the publisher's OnCommand); it is safe from any
// goroutine and returns once the loop has it queued, or has stopped.
func (a *Agent) HandleCommand(payload []byte) {
	select {
	case a.commands <- payload:
	case <-a.stopped:
	}
}

func (a *Agent) env() core.Env {
	env := core.Env{Now: a.cfg.Now(), BirthSeq: a.cfg.Publisher.BirthSeq()}
	env.APIReachable = a.cfg.APIReachable != nil && a.cfg.APIReachable()
	env.BrokerUp = a.cfg.BrokerUp != nil && a.cfg.BrokerUp()
	if a.cfg.Rebuilder != nil {
		standIns, err := a.cfg.Rebuilder.StandIns()
		if err != nil {
			a.cfg.Log.Error(err, "listing the stand-ins in the static-pod directory")
		}
		env.StandIns = standIns
	}
	return env
}

// ObserveOnce reads the runtime and publishes what changed. Not to be called while Run runs.
func (a *Agent) ObserveOnce(ctx context.Context) error {
	pods, err := a.cfg.Source.Pods(ctx)
	if a.cfg.Probe != nil {
		a.cfg.Probe.RuntimeRead(err)
	}
	if err != nil {
		return fmt.Errorf("listing the runtime's pods: %w", err)
	}
	var workers []desired.Worker
	if a.cfg.Workers != nil {
		workers = a.cfg.Workers.Workers()
	}
	a.restore(workers)
	a.execute(ctx, a.core.Observe(a.env(), pods, workers))
	return nil
}

// TickOnce applies the offline policy now. Not to be called while Run runs.
func (a *Agent) TickOnce(ctx context.Context) {
	var workers []desired.Worker
	if a.cfg.Workers != nil {
		workers = a.cfg.Workers.Workers()
	}
	env := a.env()
	a.execute(ctx, a.core.Tick(env, workers))
	if armer, ok := a.cfg.Rebuilder.(Armer); ok && env.APIReachable {
		a.armStandIns(ctx, armer, workers)
	}
}

// armStandIns arms the workers' stand-ins, logging a failure when it begins or changes, and when it ends.
func (a *Agent) armStandIns(ctx context.Context, armer Armer, workers []desired.Worker) {
	err := armer.Arm(ctx, workers)
	switch {
	case err != nil && err.Error() != a.armFailure:
		a.cfg.Log.Error(err, "arming stand-ins; tried again at every tick, logged again when the failure changes")
		a.armFailure = err.Error()
	case err == nil && a.armFailure != "":
		a.cfg.Log.Info("stand-ins armed again")
		a.armFailure = ""
	}
}

// CommandOnce decodes a command payload and executes it. A payload that does not decode is dropped (there is
// no id to answer) and reported as an error [P-BAD-1]. Not to be called while Run runs.
func (a *Agent) CommandOnce(ctx context.Context, payload []byte) error {
	cmd := &lifelinev1.Command{}
	if err := proto.Unmarshal(payload, cmd); err != nil || cmd.Id == "" {
		return fmt.Errorf("dropping a malformed command (%d bytes): %v", len(payload), err)
	}
	a.execute(ctx, a.core.Command(a.env(), cmd))
	return nil
}

// restore offers the core the episode an earlier life of the agent kept for each worker it does not know yet.
func (a *Agent) restore(workers []desired.Worker) {
	if a.cfg.Store == nil {
		return
	}
	for _, w := range workers {
		key := w.Namespace + "/" + w.Name
		if a.restored[key] || a.core.Knows(w.Namespace, w.Name) {
			continue
		}
		a.restored[key] = true
		var ep core.Episode
		data, err := a.cfg.Store.Value(episodeKey(key))
		if err == nil && data != nil && json.Unmarshal(data, &ep) == nil {
			a.core.Restore(w.Namespace, w.Name, ep)
		}
	}
}

func episodeKey(worker string) string { return "episode/" + worker }

// execute carries out actions in order, each followed by what its outcome asks for.
func (a *Agent) execute(ctx context.Context, actions []core.Action) {
	for len(actions) > 0 {
		act := actions[0]
		actions = append(actions[1:], a.core.Done(a.env(), act.Op, a.do(ctx, act))...)
		a.turned() // each action is bounded (actionTimeout): a loop busy with many is not wedged
	}
}

// do executes one action.
func (a *Agent) do(ctx context.Context, act core.Action) error {
	log := a.cfg.Log.WithValues("worker", act.Namespace+"/"+act.Name)
	switch act.Kind {
	case core.PublishState:
		return a.publishState(act, log)
	case core.ClearState:
		log.V(2).Info("the worker left the node: clearing its retained state")
		return a.cfg.Publisher.Enqueue(journal.Entry{Topic: a.workerTopic(act), QoS: 1, Retained: true, Key: act.Namespace + "/" + act.Name})
	case core.SaveEpisode:
		a.saveEpisode(act, log)
		return nil
	case core.ClaimCommand:
		if a.cfg.Store == nil {
			return nil
		}
		fresh, err := a.cfg.Store.ClaimCommand(act.CommandID, act.Until, act.At)
		if err != nil {
			return err
		}
		if !fresh {
			return core.ErrAlreadyClaimed
		}
		return nil
	case core.Restart:
		if a.cfg.Actuator == nil {
			return errors.New("no way to restart a worker is configured")
		}
		log.V(2).Info("restarting a worker on a command", "uid", act.UID)
		ctx, cancel := context.WithTimeout(ctx, actionTimeout)
		defer cancel()
		return a.cfg.Actuator.Restart(ctx, act.Namespace, act.Name, act.UID)
	case core.Rebuild:
		return a.rebuild(ctx, act, log)
	case core.Release:
		if err := a.cfg.Rebuilder.Release(act.Namespace, act.Name); err != nil {
			log.Error(err, "removing a stand-in")
			return err
		}
		log.Info("a rebuilt worker handed back: its pod runs, or it has none to run")
		return nil
	case core.SendResult:
		payload, err := proto.Marshal(act.Result)
		if err != nil {
			return fmt.Errorf("encoding the result of %s: %w", act.Result.CommandId, err)
		}
		log.V(2).Info("answering", "command", act.Result.CommandId, "outcome", act.Result.Outcome.String(), "message", act.Result.Message)
		if err := a.cfg.Publisher.Enqueue(journal.Entry{Topic: lifelinev1.NodeTopic(a.cfg.Cluster, a.cfg.Node, lifelinev1.KindResult).String(),
			Payload: payload, QoS: 1}); err != nil {
			log.Error(err, "journaling a result", "command", act.Result.CommandId)
			return err
		}
		return nil
	}
	return fmt.Errorf("unknown action %v", act.Kind)
}

// publishState journals a worker's state, retained, after the sequence it carries is kept: a restarted agent
// never publishes a sequence the controller has seen.
func (a *Agent) publishState(act core.Action, log logr.Logger) error {
	if a.cfg.Store != nil {
		if err := a.cfg.Store.AdvanceCounter(stateCounter, act.State.Seq); err != nil {
			return fmt.Errorf("keeping the worker-state sequence: %w", err)
		}
	}
	payload, err := proto.Marshal(act.State)
	if err != nil {
		return fmt.Errorf("encoding the state of %s/%s: %w", act.Namespace, act.Name, err)
	}
	log.V(4).Info("publishing a worker's state", "phase", act.State.Phase.String(), "seq", act.State.Seq, "episode", act.State.Episode)
	return a.cfg.Publisher.Enqueue(journal.Entry{Topic: a.workerTopic(act), Payload: payload, QoS: 1, Retained: true,
		Key: act.Namespace + "/" + act.Name})
}

// saveEpisode keeps a worker's episode across restarts of the agent. A failure costs only that continuity.
func (a *Agent) saveEpisode(act core.Action, log logr.Logger) {
	if a.cfg.Store == nil {
		return
	}
	var data []byte
	if act.Episode != nil {
		data, _ = json.Marshal(act.Episode)
	}
	if err := a.cfg.Store.SetValue(episodeKey(act.Namespace+"/"+act.Name), data); err != nil {
		log.Error(err, "keeping a worker's episode")
	}
}

// rebuild runs a worker again as a static pod, by its offline policy (act.Local) or on a command.
func (a *Agent) rebuild(ctx context.Context, act core.Action, log logr.Logger) error {
	ctx, cancel := context.WithTimeout(ctx, actionTimeout)
	defer cancel()
	err := a.cfg.Rebuilder.Rebuild(ctx, act.Namespace, act.Name, act.UID)
	switch {
	case err != nil && act.Local:
		log.Error(err, "healing a worker by its offline policy", "action", "rebuilt as a static pod")
	case err == nil && act.Local:
		a.offlineRebuilds.Add(1)
		log.Info("healed a worker by its offline policy", "uid", act.UID, "action", "rebuilt as a static pod")
	case err == nil:
		log.V(2).Info("rebuilt a worker as a static pod on a command", "uid", act.UID)
	}
	return err
}

func (a *Agent) workerTopic(act core.Action) string {
	return lifelinev1.WorkerTopic(a.cfg.Cluster, a.cfg.Node, act.Namespace, act.Name).String()
}
