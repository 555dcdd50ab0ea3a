package lifelinev1

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
)

func TestParseTopic(t *testing.T) {
	cases := []struct {
		topic   string
		want    Topic
		wantErr string
	}{
		{"lifeline/v1/prod/nodes/edge-1/heartbeat", Topic{Cluster: "prod", Node: "edge-1", Kind: KindHeartbeat}, ""},
		{"lifeline/v1/prod/nodes/edge-1/workers/default/sdd-trainworker-0",
			Topic{Cluster: "prod", Node: "edge-1", Kind: KindWorkerState, Namespace: "default", Pod: "sdd-trainworker-0"}, ""},
		{"lifeline/v1/prod/nodes/edge.example.com/birth", Topic{Cluster: "prod", Node: "edge.example.com", Kind: KindBirth}, ""},
		{"lifeline/v2/prod/nodes/edge-1/heartbeat", Topic{}, "is not under lifeline/v1"},
		{"lifeline/v1/prod/nodes/edge-1/gossip", Topic{}, `unknown message kind "gossip"`},
		{"lifeline/v1/prod/nodes/+/heartbeat", Topic{}, "node:"},
		{"lifeline/v1/prod/nodes/edge-1/workers/default", Topic{}, "ends in /<namespace>/<pod>"},
		{"lifeline/v1/prod/nodes/edge-1/heartbeat/extra", Topic{}, "no further levels"},
		{"lifeline/v1/Prod/nodes/edge-1/heartbeat", Topic{}, "cluster:"},
		{"lifeline/v1/prod/nodes/edge-1/workers/../x", Topic{}, "namespace:"},
	}
	for _, tc := range cases {
		got, err := ParseTopic(tc.topic)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("ParseTopic(%q) error = %v, want %q", tc.topic, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseTopic(%q) = %+v, %v; want %+v", tc.topic, got, err, tc.want)
		}
		if got.String() != tc.topic {
			t.Errorf("round trip: %q -> %q", tc.topic, got.String())
		}
	}
}

// [P-HB-2] A heartbeat is under 100 bytes on the wire.
func TestHeartbeatSize_P_HB_2(t *testing.T) {
	hb := &Heartbeat{BirthSeq: 1 << 40, Seq: 1 << 40, TimeUnixNano: 1 << 62, ApiReachable: true, JournalReports: 1<<32 - 1}
	data, err := proto.Marshal(hb)
	if err != nil {
		t.Fatal(err)
	}
	topic := NodeTopic("production-eu", "edge-node-0042", KindHeartbeat).String()
	// MQTT PUBLISH at QoS 0: fixed header (2) + topic length (2) + topic + payload.
	if wire := 2 + 2 + len(topic) + len(data); wire > 100 {
		t.Errorf("heartbeat is %d bytes on the wire (payload %d), over 100", wire, len(data))
	}
}

func FuzzParseTopic(f *testing.F) {
	for _, s := range []string{"lifeline/v1/c/nodes/n/heartbeat", "lifeline/v1/c/nodes/n/workers/ns/p", "", "////////", "lifeline/v1/c/nodes/#"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		topic, err := ParseTopic(s)
		if err != nil {
			return
		}
		again, err := ParseTopic(topic.String())
		if err != nil || again != topic {
			t.Fatalf("%q parsed to %+v, which renders to %q and parses to %+v, %v", s, topic, topic.String(), again, err)
		}
		if strings.ContainsAny(topic.Node+topic.Cluster+topic.Namespace+topic.Pod, "+#/") {
			t.Fatalf("%q: a wildcard or separator got through: %+v", s, topic)
		}
	})
}

// Every message of the protocol decodes from any bytes without panicking, and what decodes encodes and decodes
// again to the same message [P-BAD-1].
func FuzzDecodeMessages(f *testing.F) {
	for _, m := range []proto.Message{
		&NodeBirth{Node: "n", BirthSeq: 3, BootId: "b", StateId: "s"}, &NodeDeath{Node: "n", BirthSeq: 3},
		&Heartbeat{BirthSeq: 3, Seq: 9, ApiReachable: true}, &WorkerReport{Namespace: "ns", Worker: "w", Seq: 2, Body: []byte(`{}`)},
		&Command{Id: "restart/u/4", PodUid: "u", Epoch: 4, Action: Action_ACTION_RESTART, TtlMillis: 30000},
		&CommandResult{CommandId: "local/1", Namespace: "ns", Pod: "p", PodUid: "u", Local: true, Outcome: Outcome_OUTCOME_DONE},
	} {
		seed, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(seed)
	}
	f.Add([]byte{0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, m := range []proto.Message{&NodeBirth{}, &NodeDeath{}, &Heartbeat{}, &WorkerState{}, &WorkerReport{}, &Command{}, &CommandResult{}} {
			if err := proto.Unmarshal(data, m); err != nil {
				continue
			}
			again, err := proto.Marshal(m)
			if err != nil {
				t.Fatalf("a decoded %T does not encode: %v", m, err)
			}
			back := m.ProtoReflect().New().Interface()
			if err := proto.Unmarshal(again, back); err != nil || !proto.Equal(m, back) {
				t.Fatalf("a %T does not survive a round trip: %v", m, err)
			}
		}
	})
}
