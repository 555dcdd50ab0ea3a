package harness

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/lifeline-edge/lifeline/cloud/contract"
	"github.com/lifeline-edge/lifeline/cloud/edgeaware"
	"github.com/lifeline-edge/lifeline/cloud/liveness"
	"github.com/lifeline-edge/lifeline/cloud/manager"
	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
)

// EdgeCluster is the cluster name of an EdgeAware controller's topics.
const EdgeCluster = "test"

// EdgeAware is one controller running edge-aware in the test process, with an agents' table the test feeds
// itself (Ingest) and the commands it sends to agents kept (Commands).
type EdgeAware struct {
	Tracker *liveness.Tracker
	// Manager is the manager the controller runs in: its client reads the cache the controller's indexes are on.
	Manager ctrl.Manager

	mu   sync.Mutex
	sent []NodeCommand
}

// NodeCommand is a command the controller sent to a node's agent.
type NodeCommand struct {
	Node    string
	Command *lifelinev1.Command
}

// PublishCommand keeps what the controller sends.
func (e *EdgeAware) PublishCommand(node string, payload []byte) error {
	cmd := &lifelinev1.Command{}
	if err := proto.Unmarshal(payload, cmd); err != nil {
		return fmt.Errorf("decoding command to %s: %w", node, err)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.sent = append(e.sent, NodeCommand{Node: node, Command: cmd})
	return nil
}

// Commands are the commands sent so far.
func (e *EdgeAware) Commands() []NodeCommand {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]NodeCommand(nil), e.sent...)
}

// Ingest hands the tracker a message as an agent of node would publish it.
func (e *EdgeAware) Ingest(t testing.TB, topic lifelinev1.Topic, msg proto.Message) {
	t.Helper()
	payload, err := proto.Marshal(msg)
	if err != nil {
		t.Fatal(err)
	}
	e.Tracker.Ingest(topic.String(), payload, time.Now())
}

// RunEdgeAware stops the package's controller and runs instead, until the test ends, the one controller setup
// registers, edge-aware: its edgeaware.Edge has a tracker no broker feeds, and keeps the commands.
func (e *Env) RunEdgeAware(t testing.TB, setup func(mgr ctrl.Manager, edge *edgeaware.Edge) error) *EdgeAware {
	t.Helper()
	scheme, err := manager.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	workerPods, err := labels.NewRequirement(contract.RoleLabel, selection.Exists, nil)
	if err != nil {
		t.Fatal(err)
	}
	mgr, err := ctrl.NewManager(e.ControlPlane.Config, ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Controller:             config.Controller{SkipNameValidation: ptr.To(true)},
		Cache: cache.Options{ByObject: map[client.Object]cache.ByObject{
			&corev1.Pod{}: {Label: labels.NewSelector().Add(*workerPods)},
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	tracker, err := liveness.NewTracker(EdgeCluster, prometheus.NewRegistry(), logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	ea := &EdgeAware{Tracker: tracker, Manager: mgr}
	if err := setup(mgr, &edgeaware.Edge{Tracker: tracker, Commands: ea, Nodes: mgr.GetClient()}); err != nil {
		t.Fatal(err)
	}
	e.StopController()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("edge-aware controller: %v", err)
		}
		if err := e.StartController(); err != nil {
			t.Errorf("restarting the controller: %v", err)
		}
	})
	if !mgr.GetCache().WaitForCacheSync(ctx) {
		t.Fatal("edge-aware controller cache did not sync")
	}
	return ea
}

// AgentCutOff makes node's agent heard, saying its node does not reach the API server, until the test ends.
func (e *EdgeAware) AgentCutOff(t testing.TB, node string) {
	t.Helper()
	e.Ingest(t, lifelinev1.NodeTopic(EdgeCluster, node, lifelinev1.KindBirth),
		&lifelinev1.NodeBirth{Node: node, BootId: "boot-1", StateId: "state-1", BirthSeq: 1})
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { stop(); <-done })
	heartbeat := func(seq uint64) {
		e.Ingest(t, lifelinev1.NodeTopic(EdgeCluster, node, lifelinev1.KindHeartbeat),
			&lifelinev1.Heartbeat{BirthSeq: 1, Seq: seq, ApiReachable: false})
	}
	heartbeat(1)
	go func() {
		defer close(done)
		tick := time.NewTicker(300 * time.Millisecond)
		defer tick.Stop()
		for seq := uint64(2); ; seq++ {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				heartbeat(seq)
			}
		}
	}()
}

// WorkerLost makes pod's agent report that its node lost the pod: the controller asks for a rebuild, whatever
// the pod's restart policy.
func (e *EdgeAware) WorkerLost(t testing.TB, pod *corev1.Pod) {
	t.Helper()
	e.Ingest(t, lifelinev1.WorkerTopic(EdgeCluster, pod.Spec.NodeName, pod.Namespace, pod.Name), &lifelinev1.WorkerState{
		Namespace: pod.Namespace, Name: pod.Name, Uid: string(pod.UID), Role: pod.Labels[contract.RoleLabel],
		Phase: lifelinev1.Phase_PHASE_GONE, Seq: 1, Episode: 1, BirthSeq: 1,
	})
}

// RebuildSentTo tells whether a rebuild command for pod went to its node.
func (e *EdgeAware) RebuildSentTo(pod *corev1.Pod) bool {
	for _, c := range e.Commands() {
		if c.Node == pod.Spec.NodeName && c.Command.Pod == pod.Name && c.Command.PodUid == string(pod.UID) &&
			c.Command.Action == lifelinev1.Action_ACTION_REBUILD {
			return true
		}
	}
	return false
}

// AddNode registers an edge node that no kubelet serves, its Ready condition at ready, and deletes it when the
// test ends.
func (e *Env) AddNode(t testing.TB, name string, ready corev1.ConditionStatus) {
	t.Helper()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"node-role.kubernetes.io/edge": ""}}}
	if err := e.Client.Create(context.Background(), node); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Client.Delete(context.Background(), node) })
	e.SetNodeReadiness(t, name, ready)
}

// SetNodeReadiness posts a Node's Ready condition, as its kubelet (or the node lifecycle controller) would.
func (e *Env) SetNodeReadiness(t testing.TB, name string, ready corev1.ConditionStatus) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		node := &corev1.Node{}
		if err := e.Client.Get(context.Background(), client.ObjectKey{Name: name}, node); err != nil {
			return err
		}
		now := metav1.Now()
		node.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: ready, Reason: "Test",
			LastHeartbeatTime: now, LastTransitionTime: now}}
		return e.Client.Status().Update(context.Background(), node)
	})
	if err != nil {
		t.Fatalf("setting node %s Ready=%s: %v", name, ready, err)
	}
}

// RefuseStatusWrites makes the API server refuse, in namespace ns, every write of the status of resource (a
// sedna.io resource, plural), as it refuses a status grown too large, until the test ends; it returns once the
// refusal is in force.
func (e *Env) RefuseStatusWrites(t testing.TB, ns, resource string) {
	t.Helper()
	ctx := context.Background()
	const refused = "writes refused by the test"
	update := []admissionregistrationv1.OperationType{admissionregistrationv1.Update}
	policy := &admissionregistrationv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "refuse-" + resource + "-status-" + ns},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{
				{RuleWithOperations: admissionregistrationv1.RuleWithOperations{Operations: update, Rule: admissionregistrationv1.Rule{
					APIGroups: []string{"sedna.io"}, APIVersions: []string{"v1alpha1"}, Resources: []string{resource + "/status"}}}},
				// A probe, to tell when the policy is in force.
				{RuleWithOperations: admissionregistrationv1.RuleWithOperations{Operations: update, Rule: admissionregistrationv1.Rule{
					APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"configmaps"}}}},
			}},
			Validations: []admissionregistrationv1.Validation{{Expression: "false", Message: refused}},
		},
	}
	binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: policy.Name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{PolicyName: policy.Name,
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
			MatchResources: &admissionregistrationv1.MatchResources{NamespaceSelector: &metav1.LabelSelector{
				MatchLabels: map[string]string{corev1.LabelMetadataName: ns}}}},
	}
	for _, o := range []client.Object{policy, binding} {
		if err := e.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = e.Client.Delete(context.Background(), o) })
	}
	probe := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "status-refusal-probe"}}
	if err := e.Client.Create(ctx, probe); err != nil {
		t.Fatal(err)
	}
	Eventually(t, 30*time.Second, "the status refusal in force", func(ctx context.Context) (bool, error) {
		probe.Data = map[string]string{"at": time.Now().String()}
		err := e.Client.Update(ctx, probe)
		if err != nil && strings.Contains(err.Error(), refused) {
			return true, nil
		}
		return false, fmt.Errorf("probe update: %v", err)
	})
}

// ReportRunning posts a pod's status as its kubelet would once its containers run, for a pod on a node no
// kubelet serves.
func (e *Env) ReportRunning(t testing.TB, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	now := metav1.Now()
	pod.Status.Phase = corev1.PodRunning
	pod.Status.StartTime = &now
	pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
		{Type: corev1.ContainersReady, Status: corev1.ConditionTrue, LastTransitionTime: now}}
	pod.Status.ContainerStatuses = nil
	for _, c := range pod.Spec.Containers {
		pod.Status.ContainerStatuses = append(pod.Status.ContainerStatuses, corev1.ContainerStatus{Name: c.Name, Image: c.Image, Ready: true,
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}}})
	}
	if err := e.Client.Status().Update(context.Background(), pod); err != nil {
		t.Fatalf("reporting %s running: %v", pod.Name, err)
	}
	return pod
}
