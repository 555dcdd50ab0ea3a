package liveness

import (
	"fmt"
	"sync"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
)

// podRef names a worker pod.
type podRef struct{ namespace, name string }

// workloadRef names a Sedna workload whose workers reported.
type workloadRef struct{ kind, namespace, name string }

// changes are what an update of the table may have changed the view of.
type changes struct {
	pods      []podRef
	workloads []workloadRef
	// born is the node whose agent began a session, "" for none.
	born string
}

// Subscribe returns a channel that receives a pod (namespace and name only) whenever what the table says of
// that worker may have changed, and a workload (kind, namespace and name) whenever its workers reported; the
// controllers map a pod to the workload that owns it. Changes are never lost: while the reader is behind, they
// are coalesced per pod and per workload.
func (t *Tracker) Subscribe() <-chan event.GenericEvent {
	sub := &subscriber{ch: make(chan event.GenericEvent), wake: make(chan struct{}, 1),
		pods: map[podRef]bool{}, workloads: map[workloadRef]bool{}, panics: t.panics, log: t.Log}
	go sub.deliver()
	t.mu.Lock()
	t.subscribers = append(t.subscribers, sub)
	t.mu.Unlock()
	return sub.ch
}

// subscriber hands changes to one reader at its pace.
type subscriber struct {
	ch     chan event.GenericEvent
	wake   chan struct{}
	panics prometheus.Counter
	log    logr.Logger

	mu        sync.Mutex
	pods      map[podRef]bool
	workloads map[workloadRef]bool
}

func (s *subscriber) add(c changes) {
	s.mu.Lock()
	for _, p := range c.pods {
		s.pods[p] = true
	}
	for _, w := range c.workloads {
		s.workloads[w] = true
	}
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *subscriber) deliver() {
	for range s.wake {
		s.mu.Lock()
		pods, workloads := s.pods, s.workloads
		s.pods, s.workloads = map[podRef]bool{}, map[workloadRef]bool{}
		s.mu.Unlock()
		for p := range pods {
			s.send(func() client.Object {
				return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: p.namespace, Name: p.name}}
			})
		}
		for w := range workloads {
			s.send(func() client.Object {
				return &metav1.PartialObjectMetadata{TypeMeta: metav1.TypeMeta{Kind: w.kind, APIVersion: v1alpha1.GroupVersion.String()},
					ObjectMeta: metav1.ObjectMeta{Namespace: w.namespace, Name: w.name}}
			})
		}
	}
}

// send hands the reader one object. A panic in building it is counted and logged and costs that one change
// only: the delivery goroutine, and the process, live on.
func (s *subscriber) send(object func() client.Object) {
	defer func() {
		if r := recover(); r != nil {
			s.panics.Inc()
			s.log.Error(fmt.Errorf("%v", r), "delivering a liveness change")
		}
	}()
	s.ch <- event.GenericEvent{Object: object()}
}
