package manager_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/lifeline-edge/lifeline/cloud/contract"
	"github.com/lifeline-edge/lifeline/cloud/manager"
	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
	"github.com/lifeline-edge/lifeline/test/harness"
	"github.com/lifeline-edge/lifeline/test/testkit"
)

// A stand-in's mirror pod carries its worker's labels, so the JI's pod watch would map it to the JI; with armed
// stand-ins there is one beside every edge worker, changing with its node. It wakes no pass: the controller's
// cache leaves it out. A pod with the same labels that is no stand-in does wake one, so the count below can move.
func TestAStandInsMirrorPodWakesNoPass(t *testing.T) {
	harness.SkipIfShort(t)
	ns := namespace(t, "standins")
	var (
		mu     sync.Mutex
		passes int
	)
	mgr, err := manager.New(cp.Config, manager.Options{MetricsAddr: "0", HealthAddr: "0", Namespaces: []string{ns},
		Restartable: true, Instrument: func(m ctrl.Manager) ctrl.Manager {
			return harness.WithReconciled(m, func(_ string, req reconcile.Request, _ error) {
				mu.Lock()
				defer mu.Unlock()
				passes++
			})
		}})
	if err != nil {
		t.Fatal(err)
	}
	runManager(t, mgr)
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return passes
	}
	ji := createJI(t, ns, "armed", nil)
	harness.Eventually(t, 30*time.Second, "the JI reconciled", func(ctx context.Context) (bool, error) {
		err := kube.Get(ctx, client.ObjectKeyFromObject(ji), ji)
		return err == nil && ji.Status.ObservedGeneration == ji.Generation, err
	})
	// Quiet: no pass for two seconds.
	last, since := count(), time.Now()
	testkit.Until(t, 30*time.Second, "the controller quiet for 2s", func() bool {
		if n := count(); n != last {
			last, since = n, time.Now()
		}
		return time.Since(since) > 2*time.Second
	})

	pod := func(name string, standIn bool) *corev1.Pod {
		labels := map[string]string{contract.RoleLabel: "edge", contract.LabelPrefix("JointInferenceService") + "name": ji.Name}
		annotations := map[string]string{}
		if standIn {
			labels[lifelinev1.StandInLabel] = "true"
			annotations[contract.MirrorAnnotation] = "0123abcd"
			annotations[lifelinev1.StaticPodOfAnnotation] = lifelinev1.StaticPodOf(ns, "armed-edge-0")
		}
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels, Annotations: annotations},
			Spec: corev1.PodSpec{NodeName: "edge-node", Containers: []corev1.Container{{Name: "main", Image: "little"}}}}
	}
	before := count()
	if err := kube.Create(context.Background(), pod("armed-edge-0-edge-node", true)); err != nil {
		t.Fatal(err)
	}
	testkit.Sample(t, 100*time.Millisecond, 3*time.Second, func(context.Context) error {
		if n := count(); n != before {
			return fmt.Errorf("%d passes after the stand-in's mirror pod appeared", n-before)
		}
		return nil
	})
	if err := kube.Create(context.Background(), pod("lookalike", false)); err != nil {
		t.Fatal(err)
	}
	testkit.Until(t, 10*time.Second, "a pass woken by a pod of the JI that is no stand-in", func() bool { return count() > before })
}
