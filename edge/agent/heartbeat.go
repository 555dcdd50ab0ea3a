package agent

import (
	"context"
	"time"

	"google.golang.org/protobuf/proto"

	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
)

// HeartbeatSender is the session a heartbeat goes out on: QoS 0, never journaled.
type HeartbeatSender interface {
	PublishNow(topic string, payload []byte) bool
	BirthSeq() uint64
}

// Heartbeats publishes a heartbeat every interval [P-HB-1]; apiReachable reports whether the agent's view of
// the API server works.
func Heartbeats(ctx context.Context, cluster, node string, interval time.Duration, s HeartbeatSender, apiReachable func() bool) {
	topic := lifelinev1.NodeTopic(cluster, node, lifelinev1.KindHeartbeat).String()
	tick := time.NewTicker(interval)
	defer tick.Stop()
	var seq uint64
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		seq++
		payload, err := proto.Marshal(&lifelinev1.Heartbeat{BirthSeq: s.BirthSeq(), Seq: seq,
			TimeUnixNano: time.Now().UnixNano(), ApiReachable: apiReachable()})
		if err == nil {
			s.PublishNow(topic, payload)
		}
	}
}
