package liveness

import (
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
)

// fakePods is the API server's word on worker pods, as a test sets it.
type fakePods map[podRef]PodInfo

func (f fakePods) Pod(namespace, name string) (PodInfo, bool) {
	info, ok := f[podRef{namespace, name}]
	return info, ok
}

func (f fakePods) Workers(namespace, worker string) []PodInfo {
	var out []PodInfo
	for ref, info := range f {
		if ref.namespace == namespace && info.Worker == worker {
			out = append(out, info)
		}
	}
	return out
}

// bench is a tracker under test, with the API server's pods and the commands it sent.
type bench struct {
	t    testing.TB
	tr   *Tracker
	pods fakePods
	out  *recordedCommands
}

func newBench(t testing.TB) *bench {
	tr, err := NewTracker("c", prometheus.NewRegistry(), logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	b := &bench{t: t, tr: tr, pods: fakePods{}, out: &recordedCommands{}}
	tr.Pods = b.pods
	return b
}

// addPod makes the API server bind pod namespace/name (UID uid) to node; it returns the pod.
// addPod adds a worker pod under restartPolicy Never (an FL trainer's): one the node never runs again once it
// failed, so a failure calls for a rebuild.
func (b *bench) addPod(node, namespace, name, uid string) *corev1.Pod {
	b.pods[podRef{namespace, name}] = PodInfo{Node: node, UID: uid, Worker: name}
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, UID: types.UID(uid)},
		Spec: corev1.PodSpec{NodeName: node, RestartPolicy: corev1.RestartPolicyNever}}
}

func marshal(m proto.Message) []byte {
	b, err := proto.Marshal(m)
	if err != nil {
		panic(err)
	}
	return b
}

func (b *bench) birth(node string, seq uint64, stateID string, now time.Time) {
	b.ingestBirth(&lifelinev1.NodeBirth{Node: node, BirthSeq: seq, StateId: stateID, BootId: "boot"}, now)
}

// ingestBirth delivers a birth as its node publishes it.
func (b *bench) ingestBirth(m *lifelinev1.NodeBirth, now time.Time) {
	b.tr.Ingest(lifelinev1.NodeTopic("c", m.Node, lifelinev1.KindBirth).String(), marshal(m), now)
}

func (b *bench) heartbeat(node string, birthSeq, seq uint64, reachable bool, now time.Time) {
	b.tr.Ingest(lifelinev1.NodeTopic("c", node, lifelinev1.KindHeartbeat).String(),
		marshal(&lifelinev1.Heartbeat{BirthSeq: birthSeq, Seq: seq, ApiReachable: reachable}), now)
}

func (b *bench) state(node string, s *lifelinev1.WorkerState, now time.Time) {
	b.tr.Ingest(lifelinev1.WorkerTopic("c", node, s.Namespace, s.Name).String(), marshal(s), now)
}

func (b *bench) result(node string, r *lifelinev1.CommandResult, now time.Time) {
	b.tr.Ingest(lifelinev1.NodeTopic("c", node, lifelinev1.KindResult).String(), marshal(r), now)
}

func (b *bench) report(node string, seq uint64, namespace, worker, body string, now time.Time) {
	b.tr.Ingest(lifelinev1.NodeTopic("c", node, lifelinev1.KindReport).String(),
		marshal(&lifelinev1.WorkerReport{Namespace: namespace, Worker: worker, Seq: seq, Body: []byte(body)}), now)
}

// cutOff makes node's agent heard and cut off from the API server, with a fresh birth.
func (b *bench) cutOff(node string, now time.Time) {
	b.birth(node, 1, "state-"+node, now)
	b.heartbeat(node, 1, 1, false, now)
}

func (b *bench) dropped(reason string) float64 {
	return testutil.ToFloat64(b.tr.dropped.WithLabelValues(reason))
}

// workers counts the worker records the table holds for node.
func (b *bench) workers(node string) int {
	b.tr.mu.Lock()
	defer b.tr.mu.Unlock()
	if n := b.tr.nodes[node]; n != nil {
		return len(n.workers)
	}
	return 0
}

type recordedCommands struct {
	sent []*lifelinev1.Command
	to   []string
}

func (r *recordedCommands) PublishCommand(node string, payload []byte) error {
	c := &lifelinev1.Command{}
	if err := proto.Unmarshal(payload, c); err != nil {
		return err
	}
	r.sent, r.to = append(r.sent, c), append(r.to, node)
	return nil
}
