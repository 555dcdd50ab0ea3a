package agent

import (
	"sync"

	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
)

// workerDown tells whether a phase is a worker down: failed, gone, or exited 0. The episode of a worker changes
// only when it goes from up to down or back.
func workerDown(phase lifelinev1.Phase) bool {
	switch phase {
	case lifelinev1.Phase_PHASE_FAILED, lifelinev1.Phase_PHASE_GONE, lifelinev1.Phase_PHASE_SUCCEEDED:
		return true
	}
	return false
}

// episode is the stretch of a worker's life between two changes from up to down or back, named by the seq of
// the state that began it; restarts is the worker's restart count last seen in it.
type episode struct {
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
func nextEpisode(prev episode, known bool, ws *lifelinev1.WorkerState, seq uint64) episode {
	down := workerDown(ws.Phase)
	gone := ws.Phase == lifelinev1.Phase_PHASE_GONE // no containers, so no restart count
	switch {
	case !known || prev.UID != ws.Uid || prev.Down != down, down && !gone && ws.Restarts > prev.Restarts:
		return episode{UID: ws.Uid, Down: down, Seq: seq, Restarts: ws.Restarts}
	case !gone:
		prev.Restarts = ws.Restarts
	}
	return prev
}

// Episodes remembers the death episode each worker was last acted on in, shared by the command handler and
// the healer, so one death gets one restart or rebuild whoever asks: the controller's command, or the offline
// policy. It holds one entry per worker acted on; Retain drops the rest.
type Episodes struct {
	mu    sync.Mutex
	acted map[string]uint64 // pod uid -> episode
}

// Acted tells whether the worker was acted on in that episode.
func (e *Episodes) Acted(uid string, ep uint64) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	got, ok := e.acted[uid]
	return ok && got == ep
}

// Claim records an action on the worker in that episode, before acting; false: one was taken already.
func (e *Episodes) Claim(uid string, ep uint64) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if got, ok := e.acted[uid]; ok && got == ep {
		return false
	}
	if e.acted == nil {
		e.acted = map[string]uint64{}
	}
	e.acted[uid] = ep
	return true
}

// Release forgets a claim whose action failed, so the episode may be acted on again.
func (e *Episodes) Release(uid string, ep uint64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if got, ok := e.acted[uid]; ok && got == ep {
		delete(e.acted, uid)
	}
}

// Retain forgets the workers keep rejects (no longer the node's).
func (e *Episodes) Retain(keep func(uid string) bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for uid := range e.acted {
		if !keep(uid) {
			delete(e.acted, uid)
		}
	}
}
