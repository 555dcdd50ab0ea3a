package desired

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
	"github.com/lifeline-edge/lifeline/test/simnode"
	"github.com/lifeline-edge/lifeline/test/testkit"
)

// The agent's default source, KubeEdge's MetaServer on the node (here the hollow node's): it lists and watches
// the node's worker pods from the node's own store. While the node is cut off, a pod the node loses stays a
// worker.
func TestWorkersFromTheMetaServer(t *testing.T) {
	pod := func(name string, worker bool) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID("uid-" + name), Labels: map[string]string{}},
			Spec: corev1.PodSpec{NodeName: "edge-1", Containers: []corev1.Container{{Name: "main", Image: "sleeper"}}}}
		if worker {
			p.Labels[lifelinev1.RoleLabel] = "edge"
		}
		return p
	}
	client := fake.NewClientset(pod("worker", true), pod("other", false))
	node, w, ctx := watchHollowNode(t, client)
	var hold atomic.Bool
	w.Hold = hold.Load
	go w.Run(ctx, 100*time.Millisecond)
	testkit.Until(t, waitLimit, "the worker, and only it, from the MetaServer", func() bool {
		return w.Reachable() && names(w.Workers()) == "default/worker() "
	})
	// Cut off from the cloud, the node loses the pod: still a worker, to be healed.
	hold.Store(true)
	if !node.LosePod("default", "worker") {
		t.Fatal("the node had no pod to lose")
	}
	time.Sleep(300 * time.Millisecond)
	if names(w.Workers()) != "default/worker() " {
		t.Fatalf("a pod the node lost while cut off was dropped from the workers: %q", names(w.Workers()))
	}
	// Back in touch, the cloud deleted it meanwhile: the source's word stands again.
	if err := client.CoreV1().Pods("default").Delete(ctx, "worker", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	hold.Store(false)
	testkit.Until(t, waitLimit, "the deleted worker gone once the hold ended", func() bool { return len(w.Workers()) == 0 })
}

// A node with no worker yet must not take a watch of every node's workers: a connected MetaServer forwards it to
// the cloud and keeps all it delivers in the node's store, other nodes' pods (their specs, their environment)
// included, and every worker change in the cluster then travels to every idle node. The node's other pods (the
// agent's own) show that the source selects by node, so the narrow watch is the right one; and a worker that
// arrives later still comes through it.
func TestANodeWithoutWorkersKeepsNoOtherNodesPods(t *testing.T) {
	onNode := func(name, node string, worker bool) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID("uid-" + name), Labels: map[string]string{}},
			Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "main", Image: "sleeper"}}}}
		if worker {
			p.Labels[lifelinev1.RoleLabel] = "edge"
		}
		return p
	}
	client := fake.NewClientset(onNode("agent", "edge-1", false), onNode("elsewhere", "edge-2", true))
	node, w, ctx := watchHollowNode(t, client)
	go w.Run(ctx, 100*time.Millisecond)
	testkit.Until(t, waitLimit, "the watch established", w.Reachable)
	if _, err := client.CoreV1().Pods("default").Create(ctx, onNode("worker", "edge-1", true), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testkit.Until(t, waitLimit, "the node's new worker, through the narrow watch", func() bool { return names(w.Workers()) == "default/worker() " })
	if stored := node.ForeignPodsStored(); len(stored) != 0 {
		t.Errorf("the node's store holds other nodes' pods: %v", stored)
	}
}

// watchHollowNode runs hollow node edge-1 on client with its MetaServer, and a watcher of its workers through it
// (not yet running); ctx ends with the test.
func watchHollowNode(t *testing.T, client *fake.Clientset) (*simnode.Node, *Watcher, context.Context) {
	t.Helper()
	node := simnode.New(simnode.Config{NodeName: "edge-1", Client: client, StateDir: t.TempDir(),
		Images: map[string][]string{"sleeper": {"sleep", "60"}}, SyncInterval: 50 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() { _ = node.Run(ctx); close(stopped) }()
	t.Cleanup(func() { cancel(); <-stopped }) // before the state directory is removed: the node writes into it
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = node.ServeMetaServer(ctx, l) }()
	w, err := New(NewPodClient("http://"+l.Addr().String(), nil, ""), "edge-1", t.TempDir(), logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	return node, w, ctx
}
