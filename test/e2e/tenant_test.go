package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
	"github.com/lifeline-edge/lifeline/cloud/contract"
	"github.com/lifeline-edge/lifeline/cloud/nodecondition"
)

// tenantPods is how many pods of about a megabyte the tenant binds to the node: before the agent's bounds, 20 of
// them kept the chart's 64 MiB agent in an out-of-memory loop.
const tenantPods = 20

// 11. A tenant binds twenty pods of about a megabyte each (a 250 KB annotation and a 700 KB environment value,
// within the API server's limits) to the edge node, labelled as workers. The agent, under the chart's 64 MiB
// limit, is never killed; the node's LifelineAgent condition tells that those workers get no offline healing; and
// the node's own worker, lost while the node is cut off from everything, is still rebuilt by the agent.
func TestTenantPodsOfAMegabyteEachLeaveTheAgentUpAndHealing(t *testing.T) {
	skipShort(t)
	ji, pod := readyService(t)
	before, err := s.MemoryUse()
	if err != nil {
		t.Fatal(err)
	}
	bindTenantPods(t, edgeNode)
	eventually(t, within, "the tenant's pods told on the Node", func(ctx context.Context) (bool, error) {
		return strings.Contains(agentConditionMessage(ctx, t), fmt.Sprintf("%d of the node's workers get no offline healing", tenantPods)), nil
	})

	cutOff(t, edgeNode, false)
	waitEdgeWorker(t, ji, "the agent the truth", func(w v1alpha1.WorkerStatus) bool { return w.Source == v1alpha1.StatusSourceAgent })
	s.CutBroker(edgeNode)
	t.Cleanup(func() { s.RestoreBroker(edgeNode) })
	if err := s.LosePod(edgeNode, "default", pod.Name); err != nil {
		t.Fatal(err)
	}
	eventually(t, within, "the node's own worker running again as a static pod", func(context.Context) (bool, error) {
		return s.StandInRunning(edgeNode, "default", pod.Name, "little-model"), nil
	})
	s.RestoreBroker(edgeNode)
	s.RestoreAPI(edgeNode)
	eventually(t, within, "the worker back in its own pod, the static pod gone", func(context.Context) (bool, error) {
		return s.WorkerRunning(edgeNode, "default", pod.Name, "little-model") && !s.StandInRunning(edgeNode, "default", pod.Name, "little-model"), nil
	})
	waitAgentCondition(t, corev1.ConditionTrue, nodecondition.ReasonConnected)

	after, err := s.MemoryUse()
	if err != nil {
		t.Fatal(err)
	}
	if u, ok := after["agent-"+edgeNode]; ok {
		t.Logf("agent's peak memory %.1f MiB (the cgroup's, over the simulation's life)", float64(u.PeakBytes)/(1<<20))
		if kills := u.OOMKills - before["agent-"+edgeNode].OOMKills; kills > 0 {
			t.Errorf("the agent was killed %d times for outgrowing its 64 MiB", kills)
		}
	} else {
		t.Log("no memory cgroup on this machine: the agent ran without its limit")
	}
	if err := s.AgentExited(edgeNode); err != nil {
		t.Errorf("the agent ended under the tenant's pods: %v", err)
	}
}

// bindTenantPods creates the tenant's pods on node, in a namespace of their own, and deletes them when the test
// ends.
func bindTenantPods(t *testing.T, node string) {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "tenant"}}
	if err := s.Client.Create(context.Background(), ns); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = s.Client.DeleteAllOf(context.Background(), &corev1.Pod{}, client.InNamespace("tenant"), client.GracePeriodSeconds(0))
	})
	for i := range tenantPods {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("bloat-%d", i), Namespace: "tenant",
			Labels:      map[string]string{contract.RoleLabel: "edge"},
			Annotations: map[string]string{"example.com/blob": strings.Repeat("a", 250_000)}},
			Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "tenant.example/none",
				Env: []corev1.EnvVar{{Name: "BLOB", Value: strings.Repeat("b", 700_000)}}}}}}
		// The namespace's service account is made by the controller manager, just after the namespace.
		eventually(t, within, "the tenant's pod "+p.Name+" created", func(ctx context.Context) (bool, error) {
			err := s.Client.Create(ctx, p)
			return err == nil || apierrors.IsAlreadyExists(err), nil
		})
	}
}

// agentConditionMessage is the message of the edge node's LifelineAgent condition, "" without one.
func agentConditionMessage(ctx context.Context, t *testing.T) string {
	t.Helper()
	node := &corev1.Node{}
	if err := s.Client.Get(ctx, client.ObjectKey{Name: edgeNode}, node); err != nil {
		t.Fatal(err)
	}
	for _, c := range node.Status.Conditions {
		if c.Type == nodecondition.Type {
			return c.Message
		}
	}
	return ""
}
