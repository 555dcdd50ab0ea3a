package manager

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestMissingKinds(t *testing.T) {
	resources := func(names ...string) *metav1.APIResourceList {
		list := &metav1.APIResourceList{GroupVersion: "sedna.io/v1alpha1"}
		for _, n := range names {
			kind, _, _ := strings.Cut(n, "=")
			name := strings.ToLower(kind) + "s"
			if _, sub, ok := strings.Cut(n, "="); ok {
				name += "/" + sub
			}
			list.APIResources = append(list.APIResources, metav1.APIResource{Name: name, Kind: kind})
		}
		return list
	}
	tests := []struct {
		name   string
		served *metav1.APIResourceList
		want   []string
	}{
		{name: "no sedna.io CRD", served: nil, want: RequiredKinds},
		{name: "every kind served", served: resources("JointInferenceService", "FederatedLearningJob", "Model", "Dataset")},
		{name: "some", served: resources("Model", "JointInferenceService"), want: []string{"FederatedLearningJob", "Dataset"}},
		{name: "a subresource is not its kind", served: resources("JointInferenceService", "FederatedLearningJob", "Model", "Dataset=status"),
			want: []string{"Dataset"}},
		{name: "kinds of other CRDs in the group change nothing", served: resources("IncrementalLearningJob", "Model", "Dataset"),
			want: []string{"JointInferenceService", "FederatedLearningJob"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, MissingKinds(tt.served, RequiredKinds)); diff != "" {
				t.Errorf("MissingKinds (-want +got):\n%s", diff)
			}
		})
	}
}

// scriptedKinds answers Missing with each of its answers in turn, then with the last one; before each, it calls
// asked (when set), which sees what the previous answer left.
type scriptedKinds struct {
	mu      sync.Mutex
	answers []kindsAnswer
	asked   func()
}

type kindsAnswer struct {
	missing []string
	err     error
}

func (s *scriptedKinds) Missing() ([]string, error) {
	if s.asked != nil {
		s.asked()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	a := s.answers[0]
	if len(s.answers) > 1 {
		s.answers = s.answers[1:]
	}
	return a.missing, a.err
}

// The wait for the CRDs, as a script of the API server's answers: an API server that cannot be asked is logged
// once (not at each retry) and named by readiness; the missing kinds are logged once, even as they change; once
// every kind is served the controllers are set up, once, and readiness passes.
func TestCRDGateWaitsThenSetsUpOnce(t *testing.T) {
	refused := errors.New("dial tcp 10.0.0.1:443: connect: connection refused")
	kinds := &scriptedKinds{answers: []kindsAnswer{
		{err: refused}, {err: refused}, {err: refused},
		{missing: RequiredKinds}, {missing: RequiredKinds}, {missing: []string{"Dataset"}},
		{},
	}}
	var (
		mu     sync.Mutex
		lines  []string
		setups int
		seen   []string // what readiness said, each change
	)
	st := &startState{}
	log := funcr.New(func(_, args string) { mu.Lock(); lines = append(lines, args); mu.Unlock() }, funcr.Options{})
	gate := &crdGate{kinds: kinds, address: "https://10.0.0.1:443", state: st, log: log, retryMin: time.Millisecond, retryMax: 4 * time.Millisecond,
		setup: func() error {
			mu.Lock()
			defer mu.Unlock()
			setups++
			return nil
		}}
	kinds.asked = func() {
		msg := "ready"
		if err := st.crdsReady(nil); err != nil {
			msg = err.Error()
		}
		mu.Lock()
		defer mu.Unlock()
		if len(seen) == 0 || seen[len(seen)-1] != msg {
			seen = append(seen, msg)
		}
	}
	if err := gate.Start(context.Background()); err != nil {
		t.Fatalf("Start: %v", err)
	}
	if err := st.crdsReady(nil); err != nil {
		t.Errorf("crds readiness after the wait: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if setups != 1 {
		t.Errorf("set up %d times, want once", setups)
	}
	count := func(part string) int {
		n := 0
		for _, l := range lines {
			if strings.Contains(l, part) {
				n++
			}
		}
		return n
	}
	for part, want := range map[string]int{
		`"msg"="cannot reach the API server; retrying"`:                                1,
		`"address"="https://10.0.0.1:443"`:                                             1,
		`"msg"="waiting for CRDs to be established"`:                                   1,
		`"missing"=["JointInferenceService" "FederatedLearningJob" "Model" "Dataset"]`: 1,
		`"msg"="CRDs established; starting the controllers"`:                           1,
	} {
		if got := count(part); got != want {
			t.Errorf("%d lines with %s, want %d; the log:\n%s", got, part, want, strings.Join(lines, "\n"))
		}
	}
	wantSeen := []string{"the CRDs have not been checked yet",
		"cannot ask the API server at https://10.0.0.1:443 which CRDs are established: " + refused.Error(),
		"waiting for CRDs to be established: JointInferenceService, FederatedLearningJob, Model, Dataset",
		"waiting for CRDs to be established: Dataset"}
	if diff := cmp.Diff(wantSeen, seen); diff != "" {
		t.Errorf("readiness said, in turn (-want +got):\n%s", diff)
	}
}

// A gate whose context ends while it waits returns without error and sets nothing up.
func TestCRDGateStopsWithItsContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		var asked atomic.Int64
		gate := &crdGate{kinds: &scriptedKinds{answers: []kindsAnswer{{missing: RequiredKinds}}, asked: func() { asked.Add(1) }},
			state: &startState{}, log: funcr.New(func(_, _ string) {}, funcr.Options{}),
			setup: func() error { t.Error("set up without the CRDs"); return nil }}
		done := make(chan error, 1)
		go func() { done <- gate.Start(ctx) }()
		synctest.Wait() // the gate has asked, found kinds missing, and waits to ask again
		if asked.Load() != 1 {
			t.Fatalf("the gate asked %d times before its first wait, want once", asked.Load())
		}
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Start: %v", err)
			}
		case <-time.After(5 * time.Second): // the bubble's clock: reached at once if the gate is stuck
			t.Fatal("the gate did not stop with its context")
		}
	})
}

func TestBrokerReady(t *testing.T) {
	elected, standby := make(chan struct{}), make(chan struct{})
	close(elected)
	up := &sessionRunnable{running: &embedded{}}
	tests := []struct {
		name    string
		elected chan struct{}
		session *sessionRunnable
		wantErr bool
	}{
		{name: "leader, session up", elected: elected, session: up},
		{name: "leader, session not open yet", elected: elected, session: &sessionRunnable{}, wantErr: true},
		{name: "leader, before the broker is set up (CRDs missing)", elected: elected, wantErr: true},
		{name: "standby: no broker, ready to take over", elected: standby, session: &sessionRunnable{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := &startState{}
			if tt.session != nil {
				st.session.Store(tt.session)
			}
			err := brokerReady(st, tt.elected)(&http.Request{})
			if (err != nil) != tt.wantErr {
				t.Errorf("brokerReady: %v, want an error: %v", err, tt.wantErr)
			}
		})
	}
}
