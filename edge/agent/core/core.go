// Package core is the edge agent's decisions as one deterministic state machine. Its inputs are what the agent
// learns — a snapshot of the node's workers in the container runtime, a command from the controller, a tick —
// each with the time and whether the API server and the broker are reachable then; its outputs are actions as
// data (publish a worker's state, rebuild a worker, send a result, ...). It does no I/O and reads no clock: a
// thin loop (package agent) executes the actions against the runtime, the journal and the MQTT session, and
// reports each outcome back with Done. So partitions, restarts and clock jumps are tested as scripts.
//
// A Core is not safe for concurrent use: one loop owns it.
package core

import (
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/lifeline-edge/lifeline/edge/cri"
	"github.com/lifeline-edge/lifeline/edge/desired"
	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
)

// Env is what holds at the moment of an input: the agent's clock, its links, and its MQTT session.
type Env struct {
	Now time.Time
	// APIReachable: the node reaches the API server now (its watch works and, with a cloud probe, the cloud
	// answers) [P-HB-1].
	APIReachable bool
	// BrokerUp: the MQTT session is up, so the controller can send commands.
	BrokerUp bool
	// BirthSeq of the current (or last) session: a new one has every state published again.
	BirthSeq uint64
	// StandIns are the static pods the agent's rebuilds left in the node's manifest directory.
	StandIns []StandIn
}

// StandIn is a static pod the agent wrote for a worker the node would never run again. It runs in the worker's
// place until the worker's own pod, or the pod that replaces it, runs: handed back earlier, nothing would run
// until then (the node's own pod may need its link back, the controller's replacement its retry back-off).
type StandIn struct {
	// Namespace and Pod name the pod it stands in for.
	Namespace, Pod string
	// WorkerName is that pod's WORKER_NAME, which its replacement carries too; empty when the manifest has none.
	WorkerName string
}

// Config is fixed for the life of a Core.
type Config struct {
	Timing HealTiming
	// CanRebuild: a static-pod directory is configured, so ACTION_REBUILD and the offline policy can act.
	CanRebuild bool
	// FirstSeq is the first worker-state seq the core hands out; it must be greater than every seq the node
	// published before, across restarts [P-WS-2].
	FirstSeq uint64
}

// Kind names what an action does.
type Kind int

// The actions the core asks for.
const (
	// PublishState journals and sends State, retained, on its worker's topic [P-WS-1].
	PublishState Kind = iota + 1
	// ClearState sends an empty retained payload on the worker's topic: it left the node [P-WS-4].
	ClearState
	// SaveEpisode keeps Episode (nil: forgets it) for the worker across agent restarts; failing costs only the
	// episode's continuity, so its outcome is not needed.
	SaveEpisode
	// ClaimCommand durably records CommandID until Until before it is acted on [P-CMD-3]; Done takes
	// ErrAlreadyClaimed when the record shows it executed already.
	ClaimCommand
	// Restart asks the node to restart the worker's containers (ACTION_RESTART).
	Restart
	// Rebuild runs the worker again as a static pod from its last known manifest [P-HEAL-3].
	Rebuild
	// Release removes a stand-in (Namespace, Name: the pod it stood in for): its worker runs in its own pod again,
	// or no longer needs one.
	Release
	// SendResult journals and sends Result on the node's results topic [P-CMD-4] [P-HEAL-2].
	SendResult
)

var kindNames = map[Kind]string{PublishState: "publish", ClearState: "clear", SaveEpisode: "save-episode",
	ClaimCommand: "claim", Restart: "restart", Rebuild: "rebuild", Release: "release", SendResult: "result"}

func (k Kind) String() string { return kindNames[k] }

// Action is one thing the core asks the loop to do. The loop executes actions in order and reports each one's
// outcome with Done(env, action.Op, err), which may ask for more.
type Action struct {
	Op   uint64
	Kind Kind
	// Namespace, Name and UID name the worker acted on, published, cleared or saved.
	Namespace, Name, UID string
	// Local marks a Rebuild the offline policy decided, not a command.
	Local   bool
	State   *lifelinev1.WorkerState   // PublishState
	Episode *Episode                  // SaveEpisode; nil forgets
	Result  *lifelinev1.CommandResult // SendResult
	// CommandID, Until and At: ClaimCommand keeps the id until Until, forgetting ids past At.
	CommandID string
	Until, At time.Time
}

// String is the action as a script line reads it: "rebuild default/w", "result rebuild/u/5 DONE".
func (a Action) String() string {
	switch a.Kind {
	case PublishState:
		return fmt.Sprintf("publish %s/%s %s seq=%d episode=%d", a.Namespace, a.Name, phaseName(a.State.Phase), a.State.Seq, a.State.Episode)
	case SendResult:
		s := fmt.Sprintf("result %s %s", a.Result.CommandId, outcomeName(a.Result.Outcome))
		if a.Result.Local {
			s = fmt.Sprintf("result local %s/%s %s", a.Result.Namespace, a.Result.Pod, outcomeName(a.Result.Outcome))
		}
		return s
	case ClaimCommand:
		return "claim " + a.CommandID
	case Release:
		return fmt.Sprintf("release %s/%s", a.Namespace, a.Name)
	case SaveEpisode:
		if a.Episode == nil {
			return fmt.Sprintf("save-episode %s/%s none", a.Namespace, a.Name)
		}
		return fmt.Sprintf("save-episode %s/%s %d", a.Namespace, a.Name, a.Episode.Seq)
	}
	return fmt.Sprintf("%s %s/%s", a.Kind, a.Namespace, a.Name)
}

func phaseName(p lifelinev1.Phase) string {
	return map[lifelinev1.Phase]string{lifelinev1.Phase_PHASE_RUNNING: "RUNNING", lifelinev1.Phase_PHASE_PENDING: "PENDING",
		lifelinev1.Phase_PHASE_FAILED: "FAILED", lifelinev1.Phase_PHASE_SUCCEEDED: "SUCCEEDED", lifelinev1.Phase_PHASE_GONE: "GONE"}[p]
}

func outcomeName(o lifelinev1.Outcome) string {
	const prefix = len("OUTCOME_")
	if s := o.String(); len(s) > prefix {
		return s[prefix:]
	}
	return o.String()
}

// ErrAlreadyClaimed is the outcome of a ClaimCommand whose id the durable record holds already: an earlier
// life of the agent executed it.
var ErrAlreadyClaimed = errors.New("command already claimed")

// Core is the agent's state: per worker, what was published, its episode, its death, and what was done about
// it; per node, since when the API server is out of reach and which commands were executed.
type Core struct {
	cfg     Config
	seq     uint64 // the last worker-state seq handed out
	birth   uint64 // the session the workers' sent flags refer to
	workers map[string]*worker
	desired map[string]desired.Worker // by UID

	deaths   map[string]death     // by UID: its current down episode; absent while up
	healedAt map[string]time.Time // by UID: the offline policy's last rebuild
	acted    map[string]uint64    // by UID: the episode last acted on, by a command or the offline policy
	apiDown  time.Time            // zero while the API server is reachable
	unwanted map[string]time.Time // stand-in (namespace/pod) -> since when the API server wants no pod of its worker
	claims   map[string]time.Time // command id -> when it may be forgotten
	lastNow  time.Time            // the latest env.Now seen, to notice the clock stepping back

	nextOp  uint64
	pending map[uint64]pending
}

// worker is what the core knows of one worker, by namespace/name.
type worker struct {
	namespace, name string
	last            *lifelinev1.WorkerState // the latest state handed out
	sent            bool                    // last was handed out in the current session
	ep              Episode
	epKnown         bool
	// fence is what commands are checked against: the latest state handed out, kept even when sending it
	// failed (the controller may have decided on it) [P-CMD-2].
	fenceUID   string
	fenceEp    uint64
	fenceKnown bool
}

// death is a worker seen down: its containers failed or exited, or its pod is gone from the node.
type death struct {
	since   time.Time
	phase   lifelinev1.Phase
	episode uint64
}

// pending is what the core awaits the outcome of.
type pending struct {
	kind Kind
	key  string
	// PublishState: what to restore if sending failed.
	prevLast    *lifelinev1.WorkerState
	prevSent    bool
	prevEp      Episode
	prevEpKnown bool
	// Commands and local rebuilds.
	cmd     *lifelinev1.Command
	worker  desired.Worker
	episode uint64
	local   bool
}

// New returns a core that knows nothing yet.
func New(cfg Config) *Core {
	return &Core{cfg: cfg, seq: cfg.FirstSeq - min(cfg.FirstSeq, 1), workers: map[string]*worker{}, desired: map[string]desired.Worker{},
		deaths: map[string]death{}, healedAt: map[string]time.Time{}, acted: map[string]uint64{}, claims: map[string]time.Time{}, unwanted: map[string]time.Time{},
		pending: map[uint64]pending{}}
}

// Restore gives the core a worker's episode an earlier life of the agent kept, so a death seen before a
// restart stays one episode and is not commanded again [P-WS-3]. It has no effect once the core knows one.
func (c *Core) Restore(namespace, name string, ep Episode) {
	w := c.worker(namespace, name)
	if !w.epKnown {
		w.ep, w.epKnown = ep, true
	}
}

// Knows tells whether the core has a record of the worker (so there is nothing to Restore).
func (c *Core) Knows(namespace, name string) bool {
	_, ok := c.workers[namespace+"/"+name]
	return ok
}

func (c *Core) worker(namespace, name string) *worker {
	key := namespace + "/" + name
	w := c.workers[key]
	if w == nil {
		w = &worker{namespace: namespace, name: name}
		c.workers[key] = w
	}
	return w
}

func (c *Core) op(p pending) uint64 {
	c.nextOp++
	c.pending[c.nextOp] = p
	return c.nextOp
}

// setDesired takes the node's workers as the API server (or the agent's file) has them, and forgets what
// was done about workers no longer among them.
func (c *Core) setDesired(workers []desired.Worker) {
	c.desired = make(map[string]desired.Worker, len(workers))
	for _, w := range workers {
		c.desired[w.UID] = w
	}
	for _, m := range []map[string]time.Time{c.healedAt} {
		for uid := range m {
			if _, ok := c.desired[uid]; !ok {
				delete(m, uid)
			}
		}
	}
	for uid := range c.deaths {
		if _, ok := c.desired[uid]; !ok {
			delete(c.deaths, uid)
		}
	}
	for uid := range c.acted {
		if _, ok := c.desired[uid]; !ok {
			delete(c.acted, uid)
		}
	}
}

func (c *Core) isWorker(uid string) bool { _, ok := c.desired[uid]; return ok }

// completes tells whether the worker's exit 0 is its completion (restartPolicy OnFailure or Never).
func (c *Core) completes(uid string) bool {
	w, ok := c.desired[uid]
	return ok && w.RestartPolicy != desired.RestartAlways && w.RestartPolicy != ""
}

// sortedKeys makes every pass over the workers, and so the actions, deterministic.
func (c *Core) sortedKeys() []string {
	keys := make([]string, 0, len(c.workers))
	for k := range c.workers {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// clock notices the agent's clock stepping back (an NTP correction on a device that booted with a wrong
// clock): the times the core keeps are moved back with it, so a wait measured from them neither stretches by
// the step nor ends early. A step forward cannot be told from a long gap between inputs and is taken as time
// that passed.
func (c *Core) clock(env Env) {
	if !c.lastNow.IsZero() && env.Now.Before(c.lastNow) {
		back := c.lastNow.Sub(env.Now)
		if !c.apiDown.IsZero() {
			c.apiDown = c.apiDown.Add(-back)
		}
		for key, since := range c.unwanted {
			c.unwanted[key] = since.Add(-back)
		}
		for uid, d := range c.deaths {
			d.since = d.since.Add(-back)
			c.deaths[uid] = d
		}
		for uid, at := range c.healedAt {
			c.healedAt[uid] = at.Add(-back)
		}
		for id, until := range c.claims {
			c.claims[id] = until.Add(-back)
		}
	}
	c.lastNow = env.Now
}

// Observe takes a snapshot of the runtime's pods and the node's workers, and publishes what changed since
// the last one, workers that are gone included [P-WS-1]; a worker gone and no longer one of the node's is
// forgotten, its retained state cleared [P-WS-4].
func (c *Core) Observe(env Env, pods []cri.Pod, workers []desired.Worker) []Action {
	c.clock(env)
	c.setDesired(workers)
	// A new session (a reconnect, perhaps to a restarted controller with an empty table) gets every state
	// again, not only what changes next.
	if env.BirthSeq != c.birth {
		c.birth = env.BirthSeq
		for _, w := range c.workers {
			w.sent = false
		}
	}
	var out []Action
	seen := map[string]bool{}
	for _, p := range pods {
		if !c.isWorker(p.UID) {
			continue
		}
		seen[p.Namespace+"/"+p.Name] = true
		out = append(out, c.publishIfChanged(env, c.worker(p.Namespace, p.Name), c.stateOf(p))...)
	}
	out = append(out, c.lostBeforeFirstSight(env, seen)...)
	for _, key := range c.sortedKeys() {
		w := c.workers[key]
		prev := w.last
		switch {
		case seen[key], prev == nil:
		case prev.Phase == lifelinev1.Phase_PHASE_SUCCEEDED && c.completes(prev.Uid):
			// A worker that completed and whose containers the node then removed (its pod deleted, perhaps while
			// the agent still holds it as cut off) is finished, not lost: it keeps its last state, and nothing
			// rebuilds it.
		case prev.Phase != lifelinev1.Phase_PHASE_GONE:
			gone := &lifelinev1.WorkerState{Namespace: prev.Namespace, Name: prev.Name, Uid: prev.Uid, Phase: lifelinev1.Phase_PHASE_GONE}
			out = append(out, c.publishIfChanged(env, w, gone)...)
		case !c.isWorker(prev.Uid):
			out = append(out, Action{Op: c.op(pending{kind: ClearState, key: key}), Kind: ClearState,
				Namespace: w.namespace, Name: w.name, UID: prev.Uid})
		}
	}
	return out
}

// stateOf is the worker's state as its node will run it. A pod whose sandboxes the runtime holds stopped runs
// again only if the node's kubelet makes it a new one, as it does at once for a pod it knows; a kubelet booted
// while cut off knows none, and leaves the containers of its last boot where they are. So a pod the node would
// run again under its restart policy, but whose sandbox is stopped, is gone until it runs again; a completed pod
// stays completed, and a failed one under Never stays failed (the node never runs it again either way).
func (c *Core) stateOf(p cri.Pod) *lifelinev1.WorkerState {
	ws := StateOf(p)
	if !p.SandboxStopped || ws.Phase == lifelinev1.Phase_PHASE_RUNNING {
		return ws
	}
	switch c.desired[p.UID].RestartPolicy {
	case desired.RestartAlways:
		ws.Phase = lifelinev1.Phase_PHASE_GONE
	case "OnFailure":
		if ws.Phase != lifelinev1.Phase_PHASE_SUCCEEDED {
			ws.Phase = lifelinev1.Phase_PHASE_GONE
		}
	}
	return ws
}

// lostBeforeFirstSight publishes as gone the workers the node had started but the runtime does not hold, of
// which this life of the agent has published nothing: lost while no agent watched (before a restart, or while
// it was down), they would otherwise keep the last session's word — alive — and never be rebuilt.
func (c *Core) lostBeforeFirstSight(env Env, seen map[string]bool) []Action {
	uids := make([]string, 0, len(c.desired))
	for uid := range c.desired {
		uids = append(uids, uid)
	}
	sort.Strings(uids)
	var out []Action
	for _, uid := range uids {
		d := c.desired[uid]
		key := d.Namespace + "/" + d.Name
		if !d.Started || seen[key] || (c.workers[key] != nil && c.workers[key].last != nil) {
			continue
		}
		gone := &lifelinev1.WorkerState{Namespace: d.Namespace, Name: d.Name, Uid: uid, Phase: lifelinev1.Phase_PHASE_GONE}
		out = append(out, c.publishIfChanged(env, c.worker(d.Namespace, d.Name), gone)...)
	}
	return out
}

func (c *Core) publishIfChanged(env Env, w *worker, ws *lifelinev1.WorkerState) []Action {
	if w.last != nil && w.sent && SameState(w.last, ws) {
		return nil
	}
	c.seq++
	ep := nextEpisode(w.ep, w.epKnown, ws, c.seq)
	ws.Seq, ws.BirthSeq, ws.ObservedUnixNano, ws.Episode = c.seq, env.BirthSeq, env.Now.UnixNano(), ep.Seq
	p := pending{kind: PublishState, key: ws.Namespace + "/" + ws.Name, prevLast: w.last, prevSent: w.sent, prevEp: w.ep, prevEpKnown: w.epKnown}
	// Known before it is sent: a command the controller decides on this state must find it known here.
	w.fenceUID, w.fenceEp, w.fenceKnown = ws.Uid, ep.Seq, true
	c.observeDeath(env, ws)
	w.last, w.sent, w.ep, w.epKnown = ws, true, ep, true
	return []Action{{Op: c.op(p), Kind: PublishState, Namespace: ws.Namespace, Name: ws.Name, UID: ws.Uid, State: ws}}
}

// observeDeath keeps when each down worker went down, for the offline policy's DeadFor.
func (c *Core) observeDeath(env Env, ws *lifelinev1.WorkerState) {
	if !WorkerDown(ws.Phase) {
		delete(c.deaths, ws.Uid)
		return
	}
	d, already := c.deaths[ws.Uid]
	if !already || d.episode != ws.Episode || d.phase != ws.Phase {
		since := env.Now
		if already && d.episode == ws.Episode {
			since = d.since // still the same death, seen differently (failed, then gone)
		}
		c.deaths[ws.Uid] = death{since: since, phase: ws.Phase, episode: ws.Episode}
	}
}

// Done takes the outcome of an action the core asked for, and says what follows from it.
func (c *Core) Done(env Env, op uint64, err error) []Action {
	c.clock(env)
	p, ok := c.pending[op]
	if !ok {
		return nil
	}
	delete(c.pending, op)
	switch p.kind {
	case PublishState:
		return c.published(p, err)
	case ClearState:
		w := c.workers[p.key]
		if err != nil || w == nil {
			return nil // the next observation clears it again
		}
		delete(c.workers, p.key)
		return []Action{{Op: c.op(pending{kind: SaveEpisode}), Kind: SaveEpisode, Namespace: w.namespace, Name: w.name}}
	case ClaimCommand:
		return c.claimed(env, p, err)
	case Restart, Rebuild:
		if p.local {
			return c.healed(env, p, err)
		}
		return c.commandActed(env, p, err)
	}
	return nil
}

// published keeps a state that reached the journal, or forgets one that did not: the next observation
// publishes the worker's state again, with a new seq.
func (c *Core) published(p pending, err error) []Action {
	w := c.workers[p.key]
	if w == nil {
		return nil
	}
	if err != nil {
		w.last, w.sent, w.ep, w.epKnown = p.prevLast, p.prevSent, p.prevEp, p.prevEpKnown
		return nil
	}
	if p.prevEpKnown && p.prevEp == w.ep {
		return nil
	}
	ep := w.ep
	return []Action{{Op: c.op(pending{kind: SaveEpisode}), Kind: SaveEpisode, Namespace: w.namespace, Name: w.name, UID: ep.UID, Episode: &ep}}
}
