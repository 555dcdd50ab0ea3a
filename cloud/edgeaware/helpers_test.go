package edgeaware

import (
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/lifeline-edge/lifeline/cloud/liveness"
	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
)

// podRef names a pod in fakePods.
type podRef struct{ namespace, name string }

// fakePods is the API server's word on worker pods, as a test sets it.
type fakePods map[podRef]liveness.PodInfo

func (f fakePods) Pod(namespace, name string) (liveness.PodInfo, bool) {
	info, ok := f[podRef{namespace, name}]
	return info, ok
}

func (f fakePods) Workers(namespace, worker string) []liveness.PodInfo {
	var out []liveness.PodInfo
	for ref, info := range f {
		if ref.namespace == namespace && info.Worker == worker {
			out = append(out, info)
		}
	}
	return out
}

// bench is a liveness table fed as the broker feeds it, with the API server's pods and the commands it sent.
type bench struct {
	tr   *liveness.Tracker
	pods fakePods
	out  *recordedCommands
}

func newBench(t testing.TB) *bench {
	tr, err := liveness.NewTracker("c", prometheus.NewRegistry(), logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	b := &bench{tr: tr, pods: fakePods{}, out: &recordedCommands{}}
	tr.Pods = b.pods
	return b
}

// addPod makes the API server bind a worker pod under restartPolicy Never (an FL trainer's) to node.
func (b *bench) addPod(node, namespace, name, uid string) *corev1.Pod {
	b.pods[podRef{namespace, name}] = liveness.PodInfo{Node: node, UID: uid, Worker: name}
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, UID: types.UID(uid)},
		Spec: corev1.PodSpec{NodeName: node, RestartPolicy: corev1.RestartPolicyNever}}
}

func (b *bench) ingest(topic lifelinev1.Topic, m proto.Message, now time.Time) {
	payload, err := proto.Marshal(m)
	if err != nil {
		panic(err)
	}
	b.tr.Ingest(topic.String(), payload, now)
}

func (b *bench) birth(node string, seq uint64, stateID string, now time.Time) {
	b.ingest(lifelinev1.NodeTopic("c", node, lifelinev1.KindBirth), &lifelinev1.NodeBirth{Node: node, BirthSeq: seq, StateId: stateID, BootId: "boot"}, now)
}

func (b *bench) heartbeat(node string, birthSeq, seq uint64, reachable bool, now time.Time) {
	b.ingest(lifelinev1.NodeTopic("c", node, lifelinev1.KindHeartbeat), &lifelinev1.Heartbeat{BirthSeq: birthSeq, Seq: seq, ApiReachable: reachable}, now)
}

func (b *bench) state(node string, s *lifelinev1.WorkerState, now time.Time) {
	b.ingest(lifelinev1.WorkerTopic("c", node, s.Namespace, s.Name), s, now)
}

func (b *bench) result(node string, r *lifelinev1.CommandResult, now time.Time) {
	b.ingest(lifelinev1.NodeTopic("c", node, lifelinev1.KindResult), r, now)
}

func (b *bench) report(node string, r *lifelinev1.WorkerReport, now time.Time) {
	b.ingest(lifelinev1.NodeTopic("c", node, lifelinev1.KindReport), r, now)
}

// cutOff makes node's agent heard and cut off from the API server, with a fresh birth.
func (b *bench) cutOff(node string, now time.Time) {
	b.birth(node, 1, "state-"+node, now)
	b.heartbeat(node, 1, 1, false, now)
}

// recordedCommands is the broker's side of the commands the table sends.
type recordedCommands struct{ sent []*lifelinev1.Command }

func (r *recordedCommands) PublishCommand(_ string, payload []byte) error {
	c := &lifelinev1.Command{}
	if err := proto.Unmarshal(payload, c); err != nil {
		return err
	}
	r.sent = append(r.sent, c)
	return nil
}
