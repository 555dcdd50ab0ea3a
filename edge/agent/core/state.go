package core

import (
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/lifeline-edge/lifeline/edge/cri"
	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
)

// WorkerDown tells whether a phase is a worker down: failed, gone, or exited 0 [P-WS-3]. The episode of a
// worker changes only when it goes from up to down or back.
func WorkerDown(phase lifelinev1.Phase) bool {
	switch phase {
	case lifelinev1.Phase_PHASE_FAILED, lifelinev1.Phase_PHASE_GONE, lifelinev1.Phase_PHASE_SUCCEEDED:
		return true
	}
	return false
}

// Episode is the stretch of a worker's life between two changes from up to down or back, named by the seq of
// the state that began it; Restarts is the worker's restart count last seen in it. The agent keeps it on disk
// (as JSON) so a restarted agent continues it.
type Episode struct {
	UID      string `json:"uid"`
	Down     bool   `json:"down"`
	Seq      uint64 `json:"seq"`
	Restarts int32  `json:"restarts"`
}

// nextEpisode is the episode of a worker's new state ws (numbered seq) given the episode of its previous one:
// the same, unless the worker went from up to down or back, is another pod of the same name, or is down again
// with more restarts (the kubelet started it and it died again between two observations, or while the agent
// was not running). A stop that re-stamps an exited container, or a failed worker whose pod is then lost, is a
// new state of the same death, so the dead worker is acted on once.
func nextEpisode(prev Episode, known bool, ws *lifelinev1.WorkerState, seq uint64) Episode {
	down := WorkerDown(ws.Phase)
	gone := ws.Phase == lifelinev1.Phase_PHASE_GONE // no containers, so no restart count
	switch {
	case !known || prev.UID != ws.Uid || prev.Down != down, down && !gone && ws.Restarts > prev.Restarts:
		return Episode{UID: ws.Uid, Down: down, Seq: seq, Restarts: ws.Restarts}
	case !gone:
		prev.Restarts = ws.Restarts
	}
	return prev
}

// StateOf summarises a pod as the runtime shows it.
func StateOf(p cri.Pod) *lifelinev1.WorkerState {
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

// SameState compares what a receiver cares about, not the observation time or sequence numbers.
func SameState(a, b *lifelinev1.WorkerState) bool {
	x, y := proto.Clone(a).(*lifelinev1.WorkerState), proto.Clone(b).(*lifelinev1.WorkerState)
	for _, ws := range []*lifelinev1.WorkerState{x, y} {
		ws.Seq, ws.BirthSeq, ws.ObservedUnixNano, ws.Episode = 0, 0, 0, 0
	}
	return proto.Equal(x, y)
}
