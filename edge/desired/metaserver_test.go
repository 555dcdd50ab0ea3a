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
	seen := &deletionsSeen{PodSource: w.pods, judged: make(chan string, 16), linked: node.CloudLinked}
	w.pods = seen
	go w.Run(ctx, 100*time.Millisecond)
	testkit.Until(t, waitLimit, "the worker, and only it, from the MetaServer", func() bool {
		return w.Reachable() && names(w.Workers()) == "default/worker() "
	})
	// Cut off from the cloud, the node loses the pod: still a worker, to be healed.
	hold.Store(true)
	if !node.LosePod("default", "worker") {
		t.Fatal("the node had no pod to lose")
	}
	// Streaming from the node's store, the MetaServer tells the loss: the watcher must go past it. From the cloud,
	// no word of it ever comes.
	deadline := time.After(waitLimit)
	for judged := ""; seen.fromStore.Load() && judged != "uid-worker"; {
		select {
		case judged = <-seen.judged:
		case <-time.After(10 * time.Millisecond): // the node linked meanwhile: the watch from its store ends
		case <-deadline:
			t.Fatal("the MetaServer's deletion of the lost pod never reached the watcher")
		}
	}
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

// deletionsSeen is a pod source that tells which store the watch streams from, and when the watcher has gone past
// a deletion it delivered: after each, it hands the watcher one more event, of a pod on no node, which the
// watcher takes only once it is done with the deletion.
type deletionsSeen struct {
	PodSource
	fromStore atomic.Bool // the latest watch streams from the node's store, not the cloud
	judged    chan string // the UID of each deleted pod the watcher went past
	linked    func() bool // whether the node is linked to the cloud
}

// Watch settles which store the MetaServer streams from: the node's while the node is not linked to the cloud
// as it answers, the cloud's once it is (for good here: the fake API server never fails). The node's store
// selects no pod by field: a list by field that finds none after the watch began shows the node still unlinked,
// so was it when the watch began. A watch by field, which follows a list the cloud answered, streams from the
// cloud; one that began while the node may have become linked is ended, and the watcher lists and watches again.
// A watch from the store is ended too once the node links: the node's store then follows the cloud, which puts
// back a pod the node lost before the stream can tell the loss.
func (d *deletionsSeen) Watch(ctx context.Context, sel Selector, resourceVersion string) (<-chan Event, error) {
	ctx, stop := context.WithCancel(ctx)
	events, err := d.PodSource.Watch(ctx, sel, resourceVersion)
	if err != nil {
		stop()
		return nil, err
	}
	out := make(chan Event)
	if sel.Fields == "" {
		found := 0
		_, err := d.PodSource.List(ctx, Selector{Fields: "spec.nodeName=edge-1"}, func(*Pod) { found++ })
		if err != nil || found != 0 {
			stop()
			close(out)
			return out, nil
		}
	}
	d.fromStore.Store(sel.Fields == "")
	send := func(ev Event) bool {
		select {
		case out <- ev:
			return true
		case <-ctx.Done():
			return false
		}
	}
	go func() {
		defer close(out)
		defer stop()
		linkedNow := time.NewTicker(10 * time.Millisecond)
		defer linkedNow.Stop()
		for {
			var ev Event
			select {
			case e, ok := <-events:
				if !ok {
					return
				}
				ev = e
			case <-linkedNow.C:
				if d.fromStore.Load() && d.linked() {
					return
				}
				continue
			}
			if !send(ev) {
				return
			}
			if ev.Type != "DELETED" {
				continue
			}
			var elsewhere Event
			elsewhere.Type, elsewhere.Pod.Metadata.UID, elsewhere.Pod.Spec.NodeName = "MODIFIED", "uid-elsewhere", "no-such-node"
			if !send(elsewhere) {
				return
			}
			select {
			case d.judged <- ev.Pod.Metadata.UID:
			default:
			}
		}
	}()
	return out, nil
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
	// A connected MetaServer, as said: until the node links, its store answers, and no field selector selects
	// there.
	testkit.Until(t, waitLimit, "the node linked to the cloud", node.CloudLinked)
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
	t.Cleanup(cancel)
	testkit.Background(t, ctx, func(ctx context.Context) { _ = node.Run(ctx) }) // the node writes into its state directory
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
