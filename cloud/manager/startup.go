package manager

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/healthz"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
	"github.com/lifeline-edge/lifeline/internal/lograte"
)

// RequiredKinds are the sedna.io/v1alpha1 kinds the controllers watch: until the API server serves each (its CRD
// is established), the controllers cannot start.
var RequiredKinds = []string{"JointInferenceService", "FederatedLearningJob", "Model", "Dataset"}

// MissingKinds are the kinds of want that served, the API server's resources of sedna.io/v1alpha1 (nil when it
// serves none), does not hold, in want's order. Subresources (jointinferenceservices/status) are not kinds.
func MissingKinds(served *metav1.APIResourceList, want []string) []string {
	have := map[string]bool{}
	if served != nil {
		for _, r := range served.APIResources {
			if !strings.Contains(r.Name, "/") {
				have[r.Kind] = true
			}
		}
	}
	var missing []string
	for _, k := range want {
		if !have[k] {
			missing = append(missing, k)
		}
	}
	return missing
}

// kindSource tells which RequiredKinds the API server does not serve yet.
type kindSource interface {
	Missing() ([]string, error)
}

// sednaKinds asks the API server's discovery, which lists a CRD's kind once the CRD is established. Discovery
// needs no RBAC of its own (every authenticated user may read it), unlike the CRDs.
type sednaKinds struct {
	disc discovery.DiscoveryInterface
}

func (k sednaKinds) Missing() ([]string, error) {
	list, err := k.disc.ServerResourcesForGroupVersion(v1alpha1.GroupVersion.String())
	if apierrors.IsNotFound(err) {
		return MissingKinds(nil, RequiredKinds), nil // no sedna.io CRD at all
	}
	if err != nil {
		return nil, err
	}
	return MissingKinds(list, RequiredKinds), nil
}

// newDiscovery is the discovery client the wait for the CRDs asks, each request bounded so that an API server
// that does not answer is retried and logged rather than waited on forever.
func newDiscovery(cfg *rest.Config) (discovery.DiscoveryInterface, error) {
	cfg = rest.CopyConfig(cfg)
	if cfg.Timeout == 0 {
		cfg.Timeout = 10 * time.Second
	}
	return discovery.NewDiscoveryClientForConfig(cfg)
}

// startState is what the readiness checks read of the start: whether the controllers are set up (and, until
// they are, what they wait for), and the broker session.
type startState struct {
	established atomic.Bool
	waiting     atomic.Pointer[string] // why the controllers are not set up yet
	session     atomic.Pointer[sessionRunnable]
}

func (st *startState) wait(why string) { st.waiting.Store(&why) }

// addProbes adds the manager's health check (ping: it answers while the manager runs; a manager whose runnable
// fails stops, and the process with it) and its readiness checks.
func addProbes(mgr ctrl.Manager, st *startState, opts Options) error {
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return fmt.Errorf("adding the health check: %w", err)
	}
	checks := map[string]healthz.Checker{"crds": st.crdsReady, "caches": cachesReady(st, mgr.GetCache())}
	if opts.MQTTAddress != "" || opts.MQTTBrokerURL != "" {
		checks["broker"] = brokerReady(st, mgr.Elected())
	}
	for name, check := range checks {
		if err := mgr.AddReadyzCheck(name, check); err != nil {
			return fmt.Errorf("adding the readiness check %s: %w", name, err)
		}
	}
	return nil
}

// crdsReady fails until the API server serves every RequiredKind and the controllers are set up.
func (st *startState) crdsReady(*http.Request) error {
	if st.established.Load() {
		return nil
	}
	if why := st.waiting.Load(); why != nil {
		return errors.New(*why)
	}
	return errors.New("the CRDs have not been checked yet")
}

// cacheSyncProbe bounds how long a readiness probe waits on the cache: a synced cache answers at once.
const cacheSyncProbe = 200 * time.Millisecond

// cachesReady fails until the controllers are set up and the cache has synced every informer made so far.
func cachesReady(st *startState, c cache.Cache) healthz.Checker {
	return func(req *http.Request) error {
		if !st.established.Load() {
			return errors.New("no controller is set up yet")
		}
		ctx, cancel := context.WithTimeout(req.Context(), cacheSyncProbe)
		defer cancel()
		if !c.WaitForCacheSync(ctx) {
			return errors.New("the cache has not synced")
		}
		return nil
	}
}

// brokerReady fails while this replica leads (or runs alone) and its broker session is not up: the embedded
// broker does not listen yet, or the external broker has not taken the session. A standby runs no broker and is
// ready to take over: were it not ready, a rolling update of several replicas would never end.
func brokerReady(st *startState, elected <-chan struct{}) healthz.Checker {
	return func(*http.Request) error {
		select {
		case <-elected:
		default:
			return nil
		}
		s := st.session.Load()
		if s == nil || !s.up() {
			return errors.New("the MQTT broker session is not up")
		}
		return nil
	}
}

// CRD wait retries: the first wait, and the longest.
const (
	crdRetryMin = 500 * time.Millisecond
	crdRetryMax = 10 * time.Second
)

// crdGate is the runnable that, when New found the sedna.io kinds not served, waits for them and then sets the
// controllers up, while the manager runs its probes. It runs on every replica, leader or not, so a standby is
// set up to take over.
type crdGate struct {
	kinds   kindSource
	address string // the API server's, for the logs
	state   *startState
	setup   func() error
	log     logr.Logger
	// now is the clock of the log schedule (default time.Now); retryMin and retryMax bound the wait between two
	// questions to the API server (default crdRetryMin, crdRetryMax).
	now                func() time.Time
	retryMin, retryMax time.Duration
}

// NeedLeaderElection is false: standbys wait for the CRDs too.
func (g *crdGate) NeedLeaderElection() bool { return false }

// Start waits until every RequiredKind is served, then sets the controllers up. It logs once what it waits for,
// and, at a bounded rate, why the API server cannot be asked; a failed setup stops the manager.
func (g *crdGate) Start(ctx context.Context) error {
	now := g.now
	if now == nil {
		now = time.Now
	}
	retryMax := g.retryMax
	if retryMax == 0 {
		retryMax = crdRetryMax
	}
	wait := g.retryMin
	if wait == 0 {
		wait = crdRetryMin
	}
	began := now()
	var (
		toldMissing bool
		apiErrors   lograte.Schedule
	)
	for {
		missing, err := g.kinds.Missing()
		switch {
		case err != nil:
			g.state.wait(fmt.Sprintf("cannot ask the API server at %s which CRDs are established: %v", g.address, err))
			if apiErrors.Due(now()) {
				g.log.Error(err, "cannot reach the API server; retrying", "address", g.address)
			}
		case len(missing) == 0:
			g.log.Info("CRDs established; starting the controllers", "waited", now().Sub(began).Round(time.Millisecond).String())
			if err := g.setup(); err != nil {
				return err
			}
			g.state.established.Store(true)
			return nil
		default:
			apiErrors = lograte.Schedule{}
			g.state.wait("waiting for CRDs to be established: " + strings.Join(missing, ", "))
			if !toldMissing {
				toldMissing = true
				g.log.Info("waiting for CRDs to be established", "group", v1alpha1.GroupVersion.String(), "missing", missing,
					"hint", "apply deploy/crds (Helm installs them from the chart's crds/)")
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
		wait = min(2*wait, retryMax)
	}
}

// redactURL is u without its password, for logs.
func redactURL(u string) string {
	parsed, err := url.Parse(u)
	if err != nil {
		return "(a URL that does not parse)"
	}
	return parsed.Redacted()
}
