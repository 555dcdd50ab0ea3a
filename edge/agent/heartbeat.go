package agent

import (
	"context"
	"math"
	"time"

	"google.golang.org/protobuf/proto"

	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
)

// HeartbeatSender is the session a heartbeat goes out on: QoS 0, never journaled.
type HeartbeatSender interface {
	PublishNow(topic string, payload []byte) bool
	BirthSeq() uint64
}

// HeartbeatFacts are what each heartbeat says of the node, read as it is sent.
type HeartbeatFacts struct {
	// APIReachable: whether the agent's view of the API server works.
	APIReachable func() bool
	// Journaled: how many messages wait in the journal for the broker (nil: none is kept).
	Journaled func() int64
	// Oversized: how many of the node's workers get no stand-in, their pods beyond the agent's bounds (nil: none).
	Oversized func() int
	// Changed receives when APIReachable may have changed: a heartbeat goes out at once, so that a cut is told
	// when it is seen, not up to an interval later (nil: on the interval only).
	Changed <-chan struct{}
}

// Heartbeats publishes a heartbeat every interval [P-HB-1], saying facts, and one more whenever facts.Changed
// tells a change.
func Heartbeats(ctx context.Context, cluster, node string, interval time.Duration, s HeartbeatSender, facts HeartbeatFacts) {
	topic := lifelinev1.NodeTopic(cluster, node, lifelinev1.KindHeartbeat).String()
	tick := time.NewTicker(interval)
	defer tick.Stop()
	var seq uint64
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-facts.Changed:
			tick.Reset(interval)
		}
		seq++
		hb := &lifelinev1.Heartbeat{BirthSeq: s.BirthSeq(), Seq: seq, TimeUnixNano: time.Now().UnixNano(), ApiReachable: facts.APIReachable()}
		if facts.Journaled != nil {
			hb.JournalReports = uint32(min(max(facts.Journaled(), 0), math.MaxUint32))
		}
		if facts.Oversized != nil {
			hb.OversizedWorkers = uint32(min(max(facts.Oversized(), 0), math.MaxUint32))
		}
		payload, err := proto.Marshal(hb)
		if err == nil {
			s.PublishNow(topic, payload)
		}
	}
}
