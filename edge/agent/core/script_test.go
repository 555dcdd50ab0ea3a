package core

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/lifeline-edge/lifeline/edge/cri"
	"github.com/lifeline-edge/lifeline/edge/desired"
	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
)

// script drives a core as the agent's loop would, on a fake clock: a world of pods (the runtime), the node's
// workers (the API server's), two links, and the outcomes of actions. Each step returns the effects the core
// asked for — restarts, rebuilds, releases, results — as script lines ("rebuild default/w2").
type script struct {
	t       *testing.T
	core    *Core
	env     Env
	pods    map[string]cri.Pod // by name, in namespace default
	workers map[string]desired.Worker
	fail    map[Kind]error // the next action of that kind fails so
	results []*lifelinev1.CommandResult
	states  map[string]*lifelinev1.WorkerState // the latest state published per worker
	cleared []string
	// standIns are the static pods in the node's directory: a rebuild adds one, a release removes it.
	standIns map[string]StandIn
}

var t0 = time.Unix(1_000_000, 0)

func newScript(t *testing.T, cfg Config) *script {
	t.Helper()
	if cfg.Timing == (HealTiming{}) {
		cfg.Timing = DefaultHealTiming
	}
	return &script{t: t, core: New(cfg), env: Env{Now: t0, APIReachable: true, BrokerUp: true, BirthSeq: 1},
		pods: map[string]cri.Pod{}, workers: map[string]desired.Worker{}, fail: map[Kind]error{},
		states: map[string]*lifelinev1.WorkerState{}, standIns: map[string]StandIn{}}
}

// worker adds a worker of the node (restartPolicy, offline policy) running in the runtime.
func (s *script) worker(name, restartPolicy string) *script {
	s.workers[name] = desired.Worker{Namespace: "default", Name: name, UID: "uid-" + name, RestartPolicy: restartPolicy}
	s.pods[name] = cri.Pod{Namespace: "default", Name: name, UID: "uid-" + name, Containers: []cri.Container{{Name: "main", Running: true}}}
	return s
}

func (s *script) policy(name, policy string) *script {
	w := s.workers[name]
	w.OfflinePolicy = policy
	s.workers[name] = w
	return s
}

func (s *script) cutAPI() *script     { s.env.APIReachable = false; return s }
func (s *script) restoreAPI() *script { s.env.APIReachable = true; return s }
func (s *script) cutBroker() *script  { s.env.BrokerUp = false; return s }

// reconnect is a new MQTT session.
func (s *script) reconnect() *script { s.env.BrokerUp = true; s.env.BirthSeq++; return s }

// kill ends the worker's container with that exit code.
func (s *script) kill(name string, exit int32) *script {
	p := s.pods[name]
	c := p.Containers[0]
	c.Running, c.Exited, c.ExitCode, c.FinishedAt = false, true, exit, s.env.Now
	p.Containers = []cri.Container{c}
	s.pods[name] = p
	return s
}

// nodeRestarts is the node starting the worker's container again.
func (s *script) nodeRestarts(name string) *script {
	p := s.pods[name]
	c := p.Containers[0]
	c.Running, c.Exited, c.ExitCode, c.Attempt = true, false, 0, c.Attempt+1
	p.Containers = []cri.Container{c}
	s.pods[name] = p
	return s
}

// lose removes the worker's pod from the runtime: the node lost it.
func (s *script) lose(name string) *script { delete(s.pods, name); return s }

// deleteWorker removes the worker from the node's workers (its pod deleted through the API server).
func (s *script) deleteWorker(name string) *script { delete(s.workers, name); return s }

func (s *script) failNext(k Kind, err error) *script { s.fail[k] = err; return s }

func (s *script) desired() []desired.Worker {
	var out []desired.Worker
	for _, w := range s.workers {
		out = append(out, w)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// observe is the loop reading the runtime.
func (s *script) observe() []string {
	var pods []cri.Pod
	for _, p := range s.pods {
		pods = append(pods, p)
	}
	sort.Slice(pods, func(i, j int) bool { return pods[i].Name < pods[j].Name })
	s.env.StandIns = nil
	for _, name := range slices.Sorted(maps.Keys(s.standIns)) {
		s.env.StandIns = append(s.env.StandIns, s.standIns[name])
	}
	return s.run(s.core.Observe(s.env, pods, s.desired()))
}

// tick lets d pass on the agent's clock, observing and ticking every 500 ms as the loop does.
func (s *script) tick(d time.Duration) []string {
	var out []string
	for end := s.env.Now.Add(d); s.env.Now.Before(end); {
		s.env.Now = s.env.Now.Add(min(500*time.Millisecond, end.Sub(s.env.Now)))
		out = append(out, s.observe()...)
		out = append(out, s.run(s.core.Tick(s.env, s.desired()))...)
	}
	return out
}

// command delivers a command for a worker; epoch 0 means the worker's current episode.
func (s *script) command(id string, action lifelinev1.Action, name string, epoch uint64) []string {
	if epoch == 0 {
		epoch = s.state(name).Episode
	}
	return s.run(s.core.Command(s.env, &lifelinev1.Command{Id: id, Namespace: "default", Pod: name, PodUid: "uid-" + name,
		Epoch: epoch, Action: action, TtlMillis: 30000}))
}

func (s *script) state(name string) *lifelinev1.WorkerState {
	s.t.Helper()
	ws := s.states[name]
	if ws == nil {
		s.t.Fatalf("no state of %s published", name)
	}
	return ws
}

func (s *script) lastResult() *lifelinev1.CommandResult {
	s.t.Helper()
	if len(s.results) == 0 {
		s.t.Fatal("no result sent")
	}
	return s.results[len(s.results)-1]
}

// run executes actions as the loop does, and returns the effects among them.
func (s *script) run(actions []Action) []string {
	var effects []string
	for len(actions) > 0 {
		a := actions[0]
		err := s.fail[a.Kind]
		delete(s.fail, a.Kind)
		switch a.Kind {
		case PublishState:
			if err == nil {
				s.states[a.Name] = a.State
			}
		case ClearState:
			s.cleared = append(s.cleared, a.Name)
		case SendResult:
			s.results = append(s.results, a.Result)
		case Rebuild:
			if err == nil {
				s.standIns[a.Name] = StandIn{Namespace: a.Namespace, Pod: a.Name, WorkerName: s.workers[a.Name].WorkerName}
			}
		case Release:
			if err == nil {
				delete(s.standIns, a.Name)
			}
		}
		if a.Kind != PublishState && a.Kind != SaveEpisode && a.Kind != ClaimCommand && a.Kind != ClearState {
			effects = append(effects, a.String())
		}
		actions = append(actions[1:], s.core.Done(s.env, a.Op, err)...)
	}
	return effects
}

// expect fails unless the effects are exactly want.
func expect(t *testing.T, step string, got []string, want ...string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Errorf("%s: effects %q, want %q", step, got, want)
	}
}

var (
	rebuild = lifelinev1.Action_ACTION_REBUILD
	restart = lifelinev1.Action_ACTION_RESTART
)

// [P-HEAL-1] cut api and broker; a trainer fails under Never; after DeadFor past the grace it is rebuilt, once
// per death however long it stays dead.
func TestCutOffNodeRebuildsAFailedNeverTrainer_P_HEAL_1(t *testing.T) {
	s := newScript(t, Config{CanRebuild: true}).worker("w1", "Always").worker("w2", "Never")
	s.observe()
	s.cutAPI().cutBroker()
	expect(t, "cut api and broker; tick 4s", s.tick(4*time.Second))
	s.kill("w2", 1)
	expect(t, "kill w2; tick 500ms: dead for less than DeadFor", s.tick(500*time.Millisecond))
	expect(t, "tick 1s", s.tick(time.Second), "rebuild default/w2", "result local default/w2 DONE")
	expect(t, "tick 60s: the same death is not acted on again", s.tick(time.Minute))
}

// [P-HEAL-1] cut api; a dead worker is not acted on before the API server has been out of reach for the grace.
func TestNothingIsRebuiltWithinTheAPIGrace_P_HEAL_1(t *testing.T) {
	s := newScript(t, Config{CanRebuild: true}).worker("w", "Never")
	s.observe()
	s.cutAPI().cutBroker().kill("w", 1)
	expect(t, "cut api; kill w; tick 4.5s", s.tick(4500*time.Millisecond))
	expect(t, "tick 1s: past the grace", s.tick(time.Second), "rebuild default/w", "result local default/w DONE")
}

// [P-HEAL-1] A worker the node restarts by itself — crashed or exited 0 under Always, failed under OnFailure —
// is left to the node however long it stays dead; an exit 0 under OnFailure or Never is completion; a worker
// whose offline policy is None is only reported.
func TestCutOffNodeLeavesToTheNodeWhatItRestarts_P_HEAL_1(t *testing.T) {
	s := newScript(t, Config{CanRebuild: true}).worker("ji-crashed", "Always").worker("ji-exited", "Always").
		worker("onfailure", "OnFailure").worker("done", "Never").worker("none", "Never").policy("none", lifelinev1.OfflinePolicyNone)
	s.observe()
	s.cutAPI().cutBroker().kill("ji-crashed", 137).kill("ji-exited", 0).kill("onfailure", 1).kill("done", 0).kill("none", 1)
	expect(t, "cut api; kill all; tick 60s", s.tick(time.Minute))
}

// [P-HEAL-1] While the broker session is up the controller decides first: the agent acts alone once the worker
// has been dead for ControllerWait without a command.
func TestControllerDecidesFirstWhileTheBrokerIsUp_P_HEAL_1(t *testing.T) {
	s := newScript(t, Config{CanRebuild: true}).worker("w", "Never")
	s.observe()
	s.cutAPI()
	s.tick(6 * time.Second)
	s.kill("w", 1)
	expect(t, "cut api (broker up); kill w; tick 4.5s", s.tick(4500*time.Millisecond))
	expect(t, "tick 1s: the controller was silent for ControllerWait", s.tick(time.Second), "rebuild default/w", "result local default/w DONE")
}

// [P-HEAL-1] The agent acts at most once per death, on a command or by the offline policy: after the
// controller's rebuild the policy does not rebuild the same death; a new death is healed.
func TestOneActionPerDeathWhoeverAsks_P_HEAL_1(t *testing.T) {
	s := newScript(t, Config{CanRebuild: true}).worker("w", "Never")
	s.observe()
	s.cutAPI()
	s.tick(6 * time.Second)
	s.kill("w", 1)
	s.observe()
	expect(t, "command rebuild w", s.command("rebuild/uid-w/x", rebuild, "w", 0), "rebuild default/w", "result rebuild/uid-w/x DONE")
	s.cutBroker()
	expect(t, "cut broker; tick 60s", s.tick(time.Minute))
	s.nodeRestarts("w")
	s.tick(time.Second)
	s.kill("w", 1)
	expect(t, "w runs and dies again; tick 2s", s.tick(2*time.Second), "rebuild default/w", "result local default/w DONE")
}

// [P-HEAL-1] A failed rebuild may be tried again, after the cooldown.
func TestFailedRebuildIsTriedAgainAfterTheCooldown_P_HEAL_1(t *testing.T) {
	s := newScript(t, Config{CanRebuild: true}).worker("w", "Never")
	s.observe()
	s.cutAPI().cutBroker()
	s.tick(6 * time.Second)
	s.kill("w", 1).failNext(Rebuild, errors.New("disk full"))
	expect(t, "kill w; rebuild fails; tick 1.5s", s.tick(1500*time.Millisecond), "rebuild default/w", "result local default/w FAILED")
	if got := s.lastResult().Message; got != "disk full" {
		t.Errorf("failed result says %q", got)
	}
	expect(t, "tick 9s: within the cooldown", s.tick(9*time.Second))
	expect(t, "tick 1s: past it", s.tick(time.Second), "rebuild default/w", "result local default/w DONE")
}

// [P-HEAL-1] An agent with no static-pod directory only reports: nothing is rebuilt, by policy or command.
func TestWithoutAStaticPodDirectoryNothingIsRebuilt_P_HEAL_1(t *testing.T) {
	s := newScript(t, Config{}).worker("w", "Never")
	s.observe()
	s.cutAPI().cutBroker()
	s.tick(6 * time.Second)
	s.kill("w", 1)
	expect(t, "kill w; tick 60s", s.tick(time.Minute))
	expect(t, "command rebuild w", s.command("rebuild/uid-w/1", rebuild, "w", 0), "result rebuild/uid-w/1 FAILED")
}

// [P-HEAL-2] Each local rebuild is a result marked local, naming its worker, with a unique id.
func TestLocalRebuildIsReportedAsALocalResult_P_HEAL_2(t *testing.T) {
	s := newScript(t, Config{CanRebuild: true}).worker("w", "Never")
	s.observe()
	s.cutAPI().cutBroker()
	s.tick(6 * time.Second)
	var ids []string
	for i := range 2 {
		s.kill("w", 1)
		expect(t, fmt.Sprintf("death %d: tick 1.5s", i+1), s.tick(1500*time.Millisecond), "rebuild default/w", "result local default/w DONE")
		res := s.lastResult()
		if !res.Local || res.Namespace != "default" || res.Pod != "w" || res.PodUid != "uid-w" || res.BirthSeq != 1 ||
			res.Epoch != s.state("w").Episode {
			t.Errorf("local result %v, want it to name the death's episode %d", res, s.state("w").Episode)
		}
		ids = append(ids, res.CommandId)
		s.nodeRestarts("w").tick(10 * time.Second)
	}
	if ids[0] == ids[1] {
		t.Errorf("two local results share the id %s", ids[0])
	}
}

// [P-HEAL-3] cut api; the node loses w's pod: it is published GONE and rebuilt. The stand-in stays while the API
// server is back but the node has not run w's pod again (handed back then, nothing would run), and goes as soon
// as it does, so the worker is never down for the hand-over.
func TestLostPodIsRebuiltAndHandedBackOnceItsOwnPodRuns_P_HEAL_3(t *testing.T) {
	s := newScript(t, Config{CanRebuild: true}).worker("w", "Always")
	s.observe()
	s.cutAPI().cutBroker()
	s.tick(6 * time.Second)
	s.lose("w")
	expect(t, "lose w; tick 1.5s", s.tick(1500*time.Millisecond), "rebuild default/w", "result local default/w DONE")
	if got := s.state("w").Phase; got != lifelinev1.Phase_PHASE_GONE {
		t.Errorf("published %s for the lost pod, want GONE", got)
	}
	s.restoreAPI()
	expect(t, "restore api; tick 30s: w's own pod does not run yet", s.tick(30*time.Second))
	s.worker("w", "Always")
	expect(t, "the node runs w's pod again; tick 500ms", s.tick(500*time.Millisecond), "release default/w")
}

// [P-HEAL-3] Stand-ins left in the node's directory by an earlier life of the agent go as their rules say: at
// once for a worker whose pod runs; for one the API server no longer binds to the node, after unwantedGrace (a
// controller replacing a pod deletes it first); one whose pod never runs again stays, however long: it is the
// worker's only instance.
func TestStandInsOfAnEarlierLifeAreHandedBack_P_HEAL_3(t *testing.T) {
	s := newScript(t, Config{CanRebuild: true}).worker("runs", "Always").worker("never-runs", "Never")
	s.kill("never-runs", 1)
	for _, name := range []string{"runs", "never-runs", "deleted"} {
		s.standIns[name] = StandIn{Namespace: "default", Pod: name, WorkerName: name}
	}
	expect(t, "the agent starts; tick 9.5s", s.tick(9500*time.Millisecond), "release default/runs")
	expect(t, "tick 1s: 'deleted' unwanted for 10s", s.tick(time.Second), "release default/deleted")
	expect(t, "tick 9m30s", s.tick(9*time.Minute+30*time.Second))
	expect(t, "tick 1h: its pod still wanted, never run again", s.tick(time.Hour))
	s.nodeRestarts("never-runs")
	expect(t, "the node runs its pod again; tick 500ms", s.tick(500*time.Millisecond), "release default/never-runs")
}

// [P-HEAL-3] An FL trainer under Never fails on a cut-off node and is rebuilt. Once the link is back the
// controller replaces its pod, deleting the failed one before creating the next under the same WORKER_NAME: the
// stand-in stays through that gap and goes when the replacement runs.
func TestFailedTrainerStandInGoesWhenItsReplacementRuns_P_HEAL_3(t *testing.T) {
	s := newScript(t, Config{CanRebuild: true}).worker("trainer", "Never")
	w := s.workers["trainer"]
	w.WorkerName = "trainer"
	s.workers["trainer"] = w
	s.observe()
	s.cutAPI().cutBroker()
	s.tick(6 * time.Second)
	s.kill("trainer", 1)
	expect(t, "kill; tick 1.5s", s.tick(1500*time.Millisecond), "rebuild default/trainer", "result local default/trainer DONE")
	s.restoreAPI().reconnect()
	s.deleteWorker("trainer")
	delete(s.pods, "trainer")
	expect(t, "the failed pod deleted; tick 5s", s.tick(5*time.Second))
	s.workers["trainer"] = desired.Worker{Namespace: "default", Name: "trainer", UID: "uid-trainer-2", RestartPolicy: "Never",
		WorkerName: "trainer"}
	expect(t, "its replacement bound, not running; tick 2s", s.tick(2*time.Second))
	s.pods["trainer"] = cri.Pod{Namespace: "default", Name: "trainer", UID: "uid-trainer-2", Containers: []cri.Container{{Name: "main", Running: true}}}
	expect(t, "the replacement runs; tick 500ms", s.tick(500*time.Millisecond), "release default/trainer")
}

// [P-HEAL-3] A worker that completed and whose containers then vanish is finished, not lost: no GONE, no
// rebuild. A JI worker that exited 0 and vanished is lost.
func TestCompletedWorkerThatVanishesIsNotLost_P_HEAL_3(t *testing.T) {
	s := newScript(t, Config{CanRebuild: true}).worker("trainer", "OnFailure").worker("ji", "Always")
	s.kill("trainer", 0).kill("ji", 0)
	s.observe()
	s.cutAPI().cutBroker()
	s.tick(6 * time.Second)
	s.lose("trainer").lose("ji")
	expect(t, "both vanish; tick 2s", s.tick(2*time.Second), "rebuild default/ji", "result local default/ji DONE")
	if got := s.state("trainer").Phase; got != lifelinev1.Phase_PHASE_SUCCEEDED {
		t.Errorf("the completed trainer was published %s, want it left SUCCEEDED", got)
	}
}

// [P-CMD-1] A command names a worker and an action, restart or rebuild; another action is answered FAILED.
func TestCommandActsOnTheWorkerItNames_P_CMD_1(t *testing.T) {
	s := newScript(t, Config{CanRebuild: true}).worker("w1", "Never").worker("w2", "Never")
	s.kill("w2", 1)
	s.observe()
	expect(t, "command restart w2", s.command("c1", restart, "w2", 0), "restart default/w2", "result c1 DONE")
	s.kill("w1", 1)
	s.observe()
	expect(t, "command rebuild w1", s.command("c2", rebuild, "w1", 0), "rebuild default/w1", "result c2 DONE")
	s.nodeRestarts("w1").observe()
	expect(t, "command an unknown action", s.command("c3", lifelinev1.Action(99), "w1", 0), "result c3 FAILED")
}

// [P-CMD-2] A command acts on the worker's current episode and pod UID only.
func TestCommandsAreFenced_P_CMD_2(t *testing.T) {
	s := newScript(t, Config{CanRebuild: true}).worker("w", "Never")
	s.observe()
	running := s.state("w").Episode
	s.kill("w", 1).observe()
	death := s.state("w").Episode
	expect(t, "a command decided on the running worker", s.command("c1", rebuild, "w", running), "result c1 REFUSED_STALE")
	expect(t, "an episode the agent has not seen", s.command("c2", rebuild, "w", death+5), "result c2 REFUSED_STALE")
	res := s.run(s.core.Command(s.env, &lifelinev1.Command{Id: "c3", Namespace: "default", Pod: "w", PodUid: "uid-old", Epoch: death,
		Action: rebuild, TtlMillis: 30000}))
	expect(t, "another pod of the same name", res, "result c3 REFUSED_STALE")
	expect(t, "a pod not on the node", s.command("c4", rebuild, "nobody", 7), "result c4 REFUSED_STALE")
	expect(t, "the current episode", s.command("c5", rebuild, "w", death), "rebuild default/w", "result c5 DONE")
	s.nodeRestarts("w").observe()
	s.kill("w", 1).observe()
	expect(t, "a command for the previous death", s.command("c6", rebuild, "w", death), "result c6 REFUSED_STALE")
	expect(t, "the new death", s.command("c7", rebuild, "w", 0), "rebuild default/w", "result c7 DONE")
}

// [P-CMD-3] A command id is executed at most once; its lifetime runs from its receipt on the agent's clock,
// after which the id is forgotten and the episode still fences a replay; no lifetime is expired.
func TestCommandIsExecutedOnceWithinItsLifetime_P_CMD_3(t *testing.T) {
	s := newScript(t, Config{CanRebuild: true}).worker("w", "Never")
	s.kill("w", 1).observe()
	expect(t, "command", s.command("rebuild/uid-w/2", rebuild, "w", 0), "rebuild default/w", "result rebuild/uid-w/2 DONE")
	s.env.Now = s.env.Now.Add(29 * time.Second)
	expect(t, "the same id 29s later", s.command("rebuild/uid-w/2", rebuild, "w", 0), "result rebuild/uid-w/2 DUPLICATE")
	if got := s.lastResult().Message; got != "command already executed" {
		t.Errorf("duplicate by id says %q", got)
	}
	s.env.Now = s.env.Now.Add(2 * time.Second)
	expect(t, "the same id past its lifetime", s.command("rebuild/uid-w/2", rebuild, "w", 0), "result rebuild/uid-w/2 DUPLICATE")
	if got := s.lastResult().Message; !strings.Contains(got, "episode") {
		t.Errorf("duplicate by episode says %q", got)
	}
	res := s.run(s.core.Command(s.env, &lifelinev1.Command{Id: "x", Namespace: "default", Pod: "w", PodUid: "uid-w", Epoch: 2, Action: rebuild}))
	expect(t, "no lifetime", res, "result x REFUSED_EXPIRED")
}

// [P-CMD-3] An id the durable record holds (an earlier life executed it) is a duplicate, not executed; a
// record that cannot be written fails the command without acting.
func TestDurableClaimDecides_P_CMD_3(t *testing.T) {
	s := newScript(t, Config{CanRebuild: true}).worker("w", "Never")
	s.kill("w", 1).observe()
	s.failNext(ClaimCommand, ErrAlreadyClaimed)
	expect(t, "claimed by an earlier life", s.command("c1", rebuild, "w", 0), "result c1 DUPLICATE")
	s.failNext(ClaimCommand, errors.New("disk full"))
	expect(t, "claim not recorded", s.command("c2", rebuild, "w", 0), "result c2 FAILED")
	expect(t, "a later command", s.command("c3", rebuild, "w", 0), "rebuild default/w", "result c3 DONE")
}

// [P-CMD-4] Every command gets exactly one result on the results topic, naming its worker, a failed action
// included.
func TestEveryCommandGetsOneResultNamingItsWorker_P_CMD_4(t *testing.T) {
	s := newScript(t, Config{CanRebuild: true}).worker("w", "Never")
	s.kill("w", 1).observe()
	s.failNext(Rebuild, errors.New("no manifest"))
	expect(t, "rebuild fails", s.command("c1", rebuild, "w", 0), "rebuild default/w", "result c1 FAILED")
	expect(t, "tried again: the failure released the episode", s.command("c2", rebuild, "w", 0), "rebuild default/w", "result c2 DONE")
	for _, r := range s.results {
		if r.Namespace != "default" || r.Pod != "w" || r.PodUid != "uid-w" || r.Local {
			t.Errorf("result %v does not name its worker", r)
		}
	}
	if s.results[0].Message != "no manifest" {
		t.Errorf("failed result says %q", s.results[0].Message)
	}
}

// [P-CMD-5] The controller's one command per (pod UID, episode) holds because a death stays one episode: a
// stop that re-stamps the exited container and the pod lost afterwards keep it; a second command for the same
// death under another id is a duplicate.
func TestADeathIsOneEpisode_P_CMD_5(t *testing.T) {
	s := newScript(t, Config{CanRebuild: true}).worker("w", "Never")
	s.kill("w", 1).observe()
	ep := s.state("w").Episode
	s.kill("w", 1).observe()
	s.lose("w").observe()
	if got := s.state("w"); got.Episode != ep || got.Phase != lifelinev1.Phase_PHASE_GONE {
		t.Fatalf("after a re-stamp and the pod lost: %s episode %d, want episode %d", got.Phase, got.Episode, ep)
	}
	expect(t, "command", s.command(fmt.Sprintf("rebuild/uid-w/%d", ep), rebuild, "w", ep), "rebuild default/w",
		fmt.Sprintf("result rebuild/uid-w/%d DONE", ep))
	expect(t, "another id, same death", s.command("other", rebuild, "w", ep), "result other DUPLICATE")
}

// [P-CMD-6] ACTION_RESTART, which the controller does not send, still works for agents asked by hand: it goes
// to the node's restart, whatever the worker's state.
func TestRestartByHand_P_CMD_6(t *testing.T) {
	s := newScript(t, Config{}).worker("w", "Always")
	s.observe()
	expect(t, "restart a running worker", s.command("by-hand", restart, "w", 0), "restart default/w", "result by-hand DONE")
}

// [P-WS-1] [P-WS-3] A change is published at the next observation; the episode changes only when the worker
// goes from up to down or back, or is down again with more restarts; a reconnect publishes every state again
// in the same episode.
func TestEpisodeChangesOnlyWhenAWorkerGoesDownOrUp_P_WS_3(t *testing.T) {
	s := newScript(t, Config{}).worker("w", "Always")
	steps := []struct {
		name        string
		do          func()
		wantSeq     uint64
		wantEpisode uint64
	}{
		{"running", func() {}, 1, 1},
		{"killed", func() { s.kill("w", 137) }, 2, 2},
		{"a stop re-stamps the exited container", func() { s.env.Now = s.env.Now.Add(time.Second); s.kill("w", 137) }, 3, 2},
		{"the node lost the pod", func() { s.lose("w") }, 4, 2},
		{"rebuilt and running", func() { s.worker("w", "Always") }, 5, 5},
		{"a reconnect publishes it again", func() { s.reconnect() }, 6, 5},
		{"exited 0", func() { s.kill("w", 0) }, 7, 7},
		{"started again and exited again between two observations", func() { s.nodeRestarts("w").kill("w", 0) }, 8, 8},
		{"nothing changed", func() {}, 8, 8},
	}
	for _, step := range steps {
		step.do()
		s.observe()
		if ws := s.state("w"); ws.Seq != step.wantSeq || ws.Episode != step.wantEpisode {
			t.Errorf("%s: state seq %d (%s) episode %d, want seq %d episode %d", step.name, ws.Seq, ws.Phase, ws.Episode, step.wantSeq, step.wantEpisode)
		}
	}
}

// [P-WS-2] A state that could not be journaled is published again at the next observation, with a new seq;
// seqs start where the store says.
func TestUnsentStateIsPublishedAgain_P_WS_2(t *testing.T) {
	s := newScript(t, Config{FirstSeq: 40}).worker("w", "Always")
	s.failNext(PublishState, errors.New("disk full")).observe()
	if _, ok := s.states["w"]; ok {
		t.Fatal("a failed publish was recorded")
	}
	s.observe()
	if ws := s.state("w"); ws.Seq != 41 || ws.Episode != 41 {
		t.Errorf("republished as seq %d episode %d, want 41 41", ws.Seq, ws.Episode)
	}
}

// [P-WS-4] A worker whose pod is gone and that is no longer one of the node's is published GONE, then
// forgotten: its retained state is cleared, the core holds nothing of it, and a command for it is stale.
func TestWorkerThatLeftTheNodeIsForgotten_P_WS_4(t *testing.T) {
	s := newScript(t, Config{})
	for i := range 100 {
		name := fmt.Sprintf("trainer-%d", i)
		s.worker(name, "Never").observe()
		s.lose(name).deleteWorker(name)
	}
	s.observe()
	s.observe()
	if len(s.cleared) != 100 || len(s.core.workers) != 0 || len(s.core.deaths) != 0 {
		t.Errorf("%d cleared; the core holds %d workers, %d deaths", len(s.cleared), len(s.core.workers), len(s.core.deaths))
	}
	expect(t, "command a forgotten worker", s.command("c", restart, "trainer-42", 3), "result c REFUSED_STALE")
}

// A restarted agent continues the episode of a death its earlier life saw (the store keeps it).
func TestRestoredEpisodeContinues_P_WS_3(t *testing.T) {
	s := newScript(t, Config{FirstSeq: 10}).worker("w", "Always").kill("w", 1)
	s.core.Restore("default", "w", Episode{UID: "uid-w", Down: true, Seq: 7})
	s.observe()
	if ws := s.state("w"); ws.Seq != 10 || ws.Episode != 7 {
		t.Errorf("after a restart: seq %d episode %d, want seq 10 in episode 7", ws.Seq, ws.Episode)
	}
}

func TestShouldHeal_P_HEAL_1(t *testing.T) {
	timing := HealTiming{APIGrace: 5 * time.Second, DeadFor: time.Second, ControllerWait: 5 * time.Second, Cooldown: 10 * time.Second}
	cutOff := healCase{dead: true, deadFor: 2 * time.Second, apiDownFor: time.Minute}
	with := func(edit func(*healCase)) healCase { c := cutOff; edit(&c); return c }
	cases := []struct {
		name string
		c    healCase
		want bool
	}{
		{"dead, cut off from API server and broker", cutOff, true},
		{"explicit Restart policy", with(func(c *healCase) { c.policy = "Restart" }), true},
		{"policy None", with(func(c *healCase) { c.policy = lifelinev1.OfflinePolicyNone }), false},
		{"alive", with(func(c *healCase) { c.dead = false }), false},
		{"acted on this death", with(func(c *healCase) { c.actedThisEpisode = true }), false},
		{"API server reachable", with(func(c *healCase) { c.apiDownFor = 0 }), false},
		{"API server out of reach for less than the grace", with(func(c *healCase) { c.apiDownFor = 4 * time.Second }), false},
		{"dead for less than DeadFor", with(func(c *healCase) { c.deadFor = 500 * time.Millisecond }), false},
		{"controller reachable: it decides first", with(func(c *healCase) { c.controllerReachable = true }), false},
		{"controller reachable but silent too long", with(func(c *healCase) { c.controllerReachable, c.deadFor = true, 6*time.Second }), true},
		{"rebuilt moments ago", with(func(c *healCase) { c.sinceLastHeal = 3 * time.Second }), false},
		{"rebuilt long ago", with(func(c *healCase) { c.sinceLastHeal = 11 * time.Second }), true},
	}
	for _, tc := range cases {
		if got := shouldHeal(timing, tc.c); got != tc.want {
			t.Errorf("%s: shouldHeal = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestStateOf(t *testing.T) {
	at := time.Unix(100, 0)
	cases := []struct {
		name     string
		pod      cri.Pod
		phase    lifelinev1.Phase
		exit     int32
		restarts int32
	}{
		{"running", cri.Pod{Containers: []cri.Container{{Running: true, Attempt: 2}}}, lifelinev1.Phase_PHASE_RUNNING, 0, 2},
		{"failed", cri.Pod{Containers: []cri.Container{{Exited: true, ExitCode: 137, FinishedAt: at}}}, lifelinev1.Phase_PHASE_FAILED, 137, 0},
		{"succeeded", cri.Pod{Containers: []cri.Container{{Exited: true}}}, lifelinev1.Phase_PHASE_SUCCEEDED, 0, 0},
		{"one of two exited", cri.Pod{Containers: []cri.Container{{Exited: true, ExitCode: 1, FinishedAt: at}, {Running: true}}}, lifelinev1.Phase_PHASE_RUNNING, 1, 0},
		{"created", cri.Pod{Containers: []cri.Container{{}}}, lifelinev1.Phase_PHASE_PENDING, 0, 0},
		{"restarts summed", cri.Pod{Containers: []cri.Container{{Running: true, Attempt: 2}, {Running: true, Attempt: 1}}}, lifelinev1.Phase_PHASE_RUNNING, 0, 3},
	}
	for _, tc := range cases {
		ws := StateOf(tc.pod)
		if ws.Phase != tc.phase || ws.LastExitCode != tc.exit || ws.Restarts != tc.restarts {
			t.Errorf("%s: phase %s exit %d restarts %d, want %s %d %d", tc.name, ws.Phase, ws.LastExitCode, ws.Restarts, tc.phase, tc.exit, tc.restarts)
		}
	}
}

// [P-HEAL-1] The agent's clock steps back an hour (NTP corrects a device that booted with a wrong clock) while
// the node is cut off and a worker is dead: the waits are measured in the time that passed, so the worker is
// rebuilt when it would have been, not an hour late.
func TestClockSteppingBackDelaysNothing_P_HEAL_1(t *testing.T) {
	s := newScript(t, Config{CanRebuild: true}).worker("w", "Never")
	s.observe()
	s.cutAPI().cutBroker()
	expect(t, "cut api and broker; tick 3s", s.tick(3*time.Second))
	s.kill("w", 1)
	s.env.Now = s.env.Now.Add(-time.Hour)
	expect(t, "kill w; the clock steps back 1h; tick 2s: within the grace", s.tick(2*time.Second))
	expect(t, "tick 1s: past the grace, dead past DeadFor", s.tick(time.Second), "rebuild default/w", "result local default/w DONE")
}

// [P-HEAL-1] [P-CMD-3] An agent restart (a new core, the store's seq and episode given back) while cut off: the
// dead worker keeps its episode, so the controller's command for it still fences right, and the offline policy
// acts on the death once.
func TestAgentRestartWhileCutOff_P_HEAL_1(t *testing.T) {
	s := newScript(t, Config{CanRebuild: true}).worker("w", "Never")
	s.kill("w", 1).observe()
	death := *s.state("w")
	// The agent restarts: what the store kept is given back.
	s.core = New(Config{Timing: DefaultHealTiming, CanRebuild: true, FirstSeq: death.Seq + 1})
	s.core.Restore("default", "w", Episode{UID: "uid-w", Down: true, Seq: death.Episode})
	s.cutAPI().reconnect()
	s.observe()
	if got := s.state("w"); got.Episode != death.Episode || got.Seq <= death.Seq {
		t.Fatalf("after the restart: seq %d episode %d, want a seq past %d in episode %d", got.Seq, got.Episode, death.Seq, death.Episode)
	}
	expect(t, "the controller's command for the death", s.command("rebuild/uid-w/1", rebuild, "w", death.Episode),
		"rebuild default/w", "result rebuild/uid-w/1 DONE")
	s.cutBroker()
	expect(t, "cut broker; tick 60s: the death was acted on", s.tick(time.Minute))
}

// [P-WS-1] A reconnect (a new birth) has every worker's state published again, in its episode; without a change
// or a new session nothing is published again.
func TestReconnectPublishesEveryStateAgain_P_WS_1(t *testing.T) {
	s := newScript(t, Config{}).worker("w1", "Always").worker("w2", "Always")
	s.observe()
	first := map[string]uint64{"w1": s.state("w1").Seq, "w2": s.state("w2").Seq}
	episodes := map[string]uint64{"w1": s.state("w1").Episode, "w2": s.state("w2").Episode}
	s.cutBroker()
	s.observe()
	if s.state("w1").Seq != first["w1"] {
		t.Error("a state was published again without a change or a new session")
	}
	s.reconnect()
	s.observe()
	for _, name := range []string{"w1", "w2"} {
		if got := s.state(name); got.Seq == first[name] || got.Episode != episodes[name] || got.BirthSeq != 2 {
			t.Errorf("%s after the reconnect: seq %d episode %d birth %d, want a new state of episode %d in the new session",
				name, got.Seq, got.Episode, got.BirthSeq, episodes[name])
		}
	}
}

// [P-HEAL-1] A kubelet node boots while cut off: its runtime still holds the worker's containers of the last boot,
// exited, in a stopped sandbox, and its kubelet, which knows none of its pods, will never make it a new one. The
// agent (the node's standby, a new core) publishes the worker gone, not failed-and-restarting, and rebuilds it; a
// trainer that had completed, or failed under Never, keeps its phase (nothing runs it again either way).
func TestWorkerInAStoppedSandboxOfANodeBootedCutOffIsRebuilt_P_HEAL_1(t *testing.T) {
	s := newScript(t, Config{CanRebuild: true}).worker("edge", "Always").worker("done", "OnFailure").worker("failed", "Never")
	for _, name := range []string{"edge", "done", "failed"} {
		w := s.workers[name]
		w.Started = true
		s.workers[name] = w
	}
	s.cutAPI().cutBroker()
	s.kill("edge", 255).kill("done", 0).kill("failed", 1)
	for _, name := range []string{"edge", "done", "failed"} {
		p := s.pods[name]
		p.SandboxStopped = true
		s.pods[name] = p
	}
	s.observe()
	for name, want := range map[string]lifelinev1.Phase{"edge": lifelinev1.Phase_PHASE_GONE,
		"done": lifelinev1.Phase_PHASE_SUCCEEDED, "failed": lifelinev1.Phase_PHASE_FAILED} {
		if got := s.state(name).Phase; got != want {
			t.Errorf("%s published %v, want %v", name, got, want)
		}
	}
	expect(t, "tick 6s: past the grace", s.tick(6*time.Second),
		"rebuild default/edge", "rebuild default/failed", "result local default/edge DONE", "result local default/failed DONE")
}

// [P-HEAL-1] The agent starts (a new core) on a cut-off node whose worker was lost while no agent watched: the
// API server's last word says the node ran it, the runtime holds nothing. It is published gone, not left at
// the last session's alive, and rebuilt; a worker the node has not started yet is only on its way.
func TestAgentStartedAfterALossReportsItAndRebuilds_P_HEAL_1(t *testing.T) {
	s := newScript(t, Config{CanRebuild: true}).worker("lost", "Never").worker("new", "Never")
	lost := s.workers["lost"]
	lost.Started = true
	s.workers["lost"] = lost
	s.lose("lost").lose("new").cutAPI().cutBroker()
	s.observe()
	if got := s.state("lost").Phase; got != lifelinev1.Phase_PHASE_GONE {
		t.Fatalf("lost worker published %v, want GONE", got)
	}
	if _, ok := s.states["new"]; ok {
		t.Fatalf("a worker the node never started published %v", s.states["new"])
	}
	expect(t, "tick 6s: past the grace", s.tick(6*time.Second), "rebuild default/lost", "result local default/lost DONE")
}
