package soak

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
	"github.com/lifeline-edge/lifeline/test/harness"
	"github.com/lifeline-edge/lifeline/test/testkit"
)

// jiLabel names the JointInferenceService a worker pod belongs to.
const jiLabel = "jointinferenceservice.sedna.io/name"

// jiChurn plays a JointInferenceService beside the FL jobs, from its own seeded draws (so the FL faults of a
// seed stay what they were): its workers killed and deleted, its edge worker edited, the service deleted and
// created again. Its promises: a deleted service's workers stop, and once every link is mended the service
// runs one edge and one cloud worker.
type jiChurn struct {
	k        *soak
	rng      *rand.Rand
	svc      *v1alpha1.JointInferenceService // the service now, nil once deleted until the next is created
	created  int
	deleted  string       // the deleted service whose workers must stop, "" when none
	leftover []corev1.Pod // its worker pods when it was deleted
	deadline time.Time
	lastStep string
	orphans  int
	down     int
}

func newJIChurn(k *soak, seed uint64) *jiChurn {
	return &jiChurn{k: k, rng: rand.New(rand.NewPCG(seed^0x7151, seed))}
}

// create applies the helmet-detection example, with its Models, under a new name.
func (c *jiChurn) create() {
	objs, err := testkit.Objects("joint-inference.yaml", harness.FixtureVars)
	if err != nil {
		c.k.t.Fatal(err)
	}
	c.created++
	for _, obj := range objs {
		obj.SetNamespace("default")
		if ji, ok := obj.(*v1alpha1.JointInferenceService); ok {
			ji.Name = fmt.Sprintf("soak-ji-%d", c.created)
			c.svc = ji
			continue
		}
		if err := c.k.s.Client.Create(context.Background(), obj); err != nil && !apierrors.IsAlreadyExists(err) {
			c.k.t.Fatalf("creating %s of the JI example: %v", obj.GetName(), err)
		}
	}
	if err := c.k.s.Client.Create(context.Background(), c.svc); err != nil {
		c.k.t.Fatalf("creating %s: %v", c.svc.Name, err)
	}
}

// step does one seeded thing to the service.
func (c *jiChurn) step() {
	ctx := context.Background()
	if c.svc == nil {
		// The next service binds the same ports on this machine: it waits for the last one's workers to stop.
		if c.workersRunning(c.leftover) > 0 || len(c.pods(c.deleted)) > 0 {
			c.lastStep = "waiting for " + c.deleted + "'s workers to stop"
			return
		}
		c.deleted = ""
		c.create()
		c.lastStep = "create " + c.svc.Name
		return
	}
	var err error
	switch n := c.rng.IntN(100); {
	case n < 40:
		c.lastStep = "nothing"
	case n < 60, n >= 92:
		role := "edge"
		if n >= 92 {
			role = "cloud"
		}
		p, ok := c.pod(role)
		if !ok {
			c.lastStep = "no " + role + " worker to kill"
			return
		}
		c.lastStep = "kill " + p.Name
		err = c.k.s.KillWorker(p.Spec.NodeName, p.Namespace, p.Name, p.Spec.Containers[0].Name)
	case n < 72:
		p, ok := c.pod("edge")
		if !ok {
			c.lastStep = "no edge pod to delete"
			return
		}
		c.lastStep = "delete pod " + p.Name
		err = client.IgnoreNotFound(c.k.s.Client.Delete(ctx, &p))
	case n < 82:
		c.lastStep = "edit " + c.svc.Name + "'s edge worker"
		patch := fmt.Sprintf(`{"spec":{"edgeWorker":{"template":{"metadata":{"annotations":{"soak/revision":"%d"}}}}}}`, c.k.cycles)
		err = client.IgnoreNotFound(c.k.s.Client.Patch(ctx, c.svc.DeepCopy(), client.RawPatch(types.MergePatchType, []byte(patch))))
	default:
		c.lastStep = "delete " + c.svc.Name
		c.leftover = c.pods(c.svc.Name)
		err = client.IgnoreNotFound(c.k.s.Client.Delete(ctx, c.svc))
		c.deleted, c.deadline, c.svc = c.svc.Name, time.Now().Add(2*time.Minute), nil
	}
	if err != nil {
		c.k.t.Logf("cycle %d (JI: %s): %v", c.k.cycles, c.lastStep, err)
	}
}

// check counts a deleted service whose workers still run two minutes after its deletion, with every link to
// their node mended (the JI's edge worker runs on edge3, which the faults leave alone).
func (c *jiChurn) check() {
	if c.deleted == "" || time.Now().Before(c.deadline) {
		return
	}
	if n := c.workersRunning(c.leftover); n > 0 {
		c.orphans++
		c.k.t.Errorf("cycle %d: %d worker processes of %s still run two minutes after its deletion", c.k.cycles, n, c.deleted)
		c.deadline = time.Now().Add(time.Hour) // counted once
	}
}

// finish checks, once every link is mended, that the service runs one edge and one cloud worker, each a pod
// the API server shows Running and a process on its node.
func (c *jiChurn) finish() {
	if c.svc == nil {
		return
	}
	var missing []string
	if poll(time.Second, 2*time.Minute, true, func() bool {
		missing = nil
		for _, role := range []string{"edge", "cloud"} {
			p, ok := c.pod(role)
			if !ok || p.Status.Phase != corev1.PodRunning || !c.k.s.WorkerRunning(p.Spec.NodeName, p.Namespace, p.Name, p.Spec.Containers[0].Name) {
				missing = append(missing, role)
			}
		}
		return len(missing) == 0
	}) {
		return
	}
	c.down++
	c.k.t.Errorf("%s: no running %v worker two minutes after every link was mended", c.svc.Name, missing)
}

// pods lists the worker pods of the named service.
func (c *jiChurn) pods(name string) []corev1.Pod {
	if name == "" {
		return nil
	}
	list := &corev1.PodList{}
	if err := c.k.s.Client.List(context.Background(), list, client.InNamespace("default"), client.MatchingLabels{jiLabel: name}); err != nil {
		c.k.t.Logf("listing %s's pods: %v", name, err)
		return nil
	}
	return list.Items
}

// pod is a live pod of the service's worker of that role (edge or cloud).
func (c *jiChurn) pod(role string) (corev1.Pod, bool) {
	if c.svc == nil {
		return corev1.Pod{}, false
	}
	for _, p := range c.pods(c.svc.Name) {
		if p.Labels["lifeline.sedna.io/role"] == role && p.DeletionTimestamp == nil && p.Spec.NodeName != "" && len(p.Spec.Containers) > 0 {
			return p, true
		}
	}
	return corev1.Pod{}, false
}

// workersRunning counts the processes of the given worker pods, and of the static pods standing in for them,
// on every node.
func (c *jiChurn) workersRunning(pods []corev1.Pod) int {
	n := 0
	for _, p := range pods {
		for _, node := range nodes {
			for _, pod := range []string{p.Name, p.Name + "-" + node} {
				for _, container := range containerNames(&p) {
					if c.k.s.WorkerRunning(node, p.Namespace, pod, container) {
						n++
					}
				}
			}
		}
	}
	return n
}
