package liveness

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
)

// [P-BIRTH-3] An agent's heartbeat seq restarts at 1 with each process. After a restart (a newer birth) its
// heartbeats were dropped as replayed for as long as the previous session had run, and the node looked silent;
// every newer birth resets the node's heartbeat seq.
func TestHeartbeatsAfterAgentRestartAccepted_P_BIRTH_3(t *testing.T) {
	b := newBench(t)
	now := time.Unix(1000, 0)
	pod := b.addPod("edge1", "default", "w", "u")
	b.birth("edge1", 5, "s", now)
	for seq := uint64(1); seq <= 100; seq++ {
		b.heartbeat("edge1", 5, seq, true, now)
	}
	b.birth("edge1", 6, "s", now) // the agent restarted
	b.state("edge1", &lifelinev1.WorkerState{Namespace: "default", Name: "w", Uid: "u", Seq: 1, Phase: lifelinev1.Phase_PHASE_FAILED}, now)
	later := now.Add(10 * time.Second)
	b.heartbeat("edge1", 6, 1, false, later)
	if v := b.tr.ViewOf(pod, false, later); v.Truth != TruthAgent {
		t.Errorf("truth %s after the agent restarted and said it is cut off, want Agent", v.Truth)
	}
	if got := b.dropped(DropReplayed); got != 0 {
		t.Errorf("%v messages of the restarted agent dropped as replayed", got)
	}
}

// [P-BIRTH-3] A wiped state directory starts the agent's birth seq (and every other seq) at 1 again; its
// birth, with a new state id, was dropped as replayed and locked the node out until the controller restarted.
// It starts a new epoch: taken whatever its seq, with the node's heartbeat, report and state seqs reset.
func TestWipedStateDirIsANewEpoch(t *testing.T) {
	for _, c := range []struct {
		name, stateID, bootID string
	}{{"wiped state directory", "s2", "boot"}, {"reboot", "s1", "boot2"}} {
		t.Run(c.name, func(t *testing.T) {
			b := newBench(t)
			now := time.Unix(1000, 0)
			pod := b.addPod("edge1", "default", "w", "u")
			b.pods[podRef{"default", "t0"}] = PodInfo{Node: "edge1", UID: "t0", Worker: "t0", OwnerKind: "FederatedLearningJob", OwnerName: "job"}
			b.birth("edge1", 40, "s1", now)
			b.heartbeat("edge1", 40, 500, true, now)
			b.state("edge1", &lifelinev1.WorkerState{Namespace: "default", Name: "w", Uid: "u", Seq: 900, Phase: lifelinev1.Phase_PHASE_RUNNING}, now)
			b.report("edge1", 700, "default", "t0", `{"name":"t0","namespace":"default","ownerName":"job","ownerKind":"default","kind":"train","status":"running","ownerInfo":{"currentRound":1}}`, now)

			b.tr.Ingest(lifelinev1.NodeTopic("c", "edge1", lifelinev1.KindBirth).String(),
				marshal(&lifelinev1.NodeBirth{Node: "edge1", BirthSeq: 1, StateId: c.stateID, BootId: c.bootID}), now)
			b.heartbeat("edge1", 1, 1, false, now)
			b.state("edge1", &lifelinev1.WorkerState{Namespace: "default", Name: "w", Uid: "u", Seq: 1, Phase: lifelinev1.Phase_PHASE_FAILED}, now)
			b.report("edge1", 1, "default", "t0", `{"name":"t0","namespace":"default","ownerName":"job","ownerKind":"default","kind":"train","status":"running","ownerInfo":{"currentRound":2}}`, now)
			if got := b.dropped(DropReplayed); got != 0 {
				t.Errorf("%v messages of the new epoch dropped as replayed", got)
			}
			v := b.tr.ViewOf(pod, false, now)
			if v.Truth != TruthAgent || v.State.Phase != lifelinev1.Phase_PHASE_FAILED {
				t.Errorf("view %+v, want the new epoch's FAILED from the agent", v)
			}
			if reps := b.tr.Reports("FederatedLearningJob", "default", "job"); len(reps) != 1 || reps[0].OwnerInfo["currentRound"] != float64(2) {
				t.Errorf("reports %+v, want the new epoch's round 2", reps)
			}
			b.state("edge1", &lifelinev1.WorkerState{Namespace: "default", Name: "w", Uid: "u", Seq: 1, Phase: lifelinev1.Phase_PHASE_RUNNING}, now)
			if got := b.dropped(DropReplayed); got != 1 {
				t.Errorf("a repeated seq within the new epoch: %v dropped as replayed, want 1", got)
			}
		})
	}
}

// [P-BIRTH-2] Within an epoch an older birth is a replay, dropped; the current one again is a QoS 1
// redelivery, ignored without counting it and without undoing the session's death.
func TestBirthsWithinAnEpoch(t *testing.T) {
	b := newBench(t)
	now := time.Unix(1000, 0)
	b.birth("edge1", 5, "s", now)
	b.tr.Ingest(lifelinev1.NodeTopic("c", "edge1", lifelinev1.KindDeath).String(), marshal(&lifelinev1.NodeDeath{Node: "edge1", BirthSeq: 5}), now)
	b.birth("edge1", 5, "s", now)
	if b.dropped(DropReplayed) != 0 || !b.tr.nodes["edge1"].dead {
		t.Errorf("the redelivered birth was counted (%v) or revived the dead session (dead=%v)", b.dropped(DropReplayed), b.tr.nodes["edge1"].dead)
	}
	b.birth("edge1", 4, "s", now)
	if b.dropped(DropReplayed) != 1 {
		t.Errorf("an older birth of the epoch not dropped as replayed")
	}
	if got := testutil.ToFloat64(b.tr.received.WithLabelValues("birth")); got != 2 {
		t.Errorf("%v births accepted, want 2 (the first and its redelivery)", got)
	}
}
