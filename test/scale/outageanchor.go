package scale

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
	"github.com/lifeline-edge/lifeline/cloud/manager"
	"github.com/lifeline-edge/lifeline/test/harness"
)

// anchorGroup is the API group of the outage anchor's copies of the workloads: Lifeline's CRDs, schemas and all,
// under a group no controller watches.
const anchorGroup = "anchor.lifeline.test"

// anchorVersion is the API version of the outage anchor's copies.
var anchorVersion = schema.GroupVersion{Group: anchorGroup, Version: "v1alpha1"}

// AnchorNamespace holds the outage anchor's copies of the workloads.
const AnchorNamespace = "scale-outage-anchor"

// anchorPlurals are the resources the outage writes the status of, by kind.
var anchorPlurals = map[string]string{"JointInferenceService": "jointinferenceservices", "FederatedLearningJob": "federatedlearningjobs"}

// measureOutageAnchor times the outage's status writes made by a client that does nothing else, on the same
// machine with the same fleet heartbeating: every workload, status and all, is copied into an object of the same
// schema that no controller watches; once the API server is quiet and kwok has left every edge node, as in the
// outage, the copies' statuses are written as the outage writes them (each worker on an edge node in its agent's
// word), with as many writes in flight as the controller has passes (its default ConcurrentReconciles for each
// kind); then, once this outage has lasted as long as the one measured, written back in the API server's word as
// kwok takes the nodes back, as the heal writes them. Each clock stops when the harness has seen every write
// through a watch, as the outage's and the heal's do (watchAnchor). What Lifeline takes beyond them is its own:
// noticing the agents' word, the passes, and the CPU they take from the API server.
func (h *scaleRun) measureOutageAnchor(ctx context.Context, r *Result) {
	h.check(h.installAnchorCRDs(ctx))
	cfg := rest.CopyConfig(h.cp.Config)
	cfg.QPS = -1 // as the controller's client: no limit but the API server's
	dyn, err := dynamic.NewForConfig(cfg)
	h.check(err)
	_, err = h.kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: AnchorNamespace}}, metav1.CreateOptions{})
	h.check(err)
	var copies []*unstructured.Unstructured
	for _, plural := range anchorPlurals {
		list, err := dyn.Resource(v1alpha1.GroupVersion.WithResource(plural)).Namespace(Namespace).List(ctx, metav1.ListOptions{})
		h.check(err)
		for i := range list.Items {
			copies = append(copies, anchorCopy(&list.Items[i]))
		}
	}
	anchored := func(plural string) dynamic.ResourceInterface {
		return dyn.Resource(anchorVersion.WithResource(plural)).Namespace(AnchorNamespace)
	}
	resource := func(u *unstructured.Unstructured) dynamic.ResourceInterface {
		return anchored(anchorPlurals[u.GetKind()])
	}
	h.check(h.forEach(h.cfg.Parallelism, len(copies), func(i int) error {
		status := copies[i].Object["status"]
		created, err := resource(copies[i]).Create(ctx, copies[i], metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("creating the anchor's copy of %s: %w", copies[i].GetName(), err)
		}
		created.Object["status"] = status
		copies[i], err = resource(created).UpdateStatus(ctx, created, metav1.UpdateOptions{})
		return err
	}))
	watched, stopWatching := h.watchAnchor(ctx)
	defer stopWatching()
	h.waitQuiet()

	edge, now := nodeSet(h.fleet.nodes()), time.Now().UTC().Format(time.RFC3339)
	cut := 0
	for _, c := range copies {
		cut += toWord(c, edge, v1alpha1.StatusSourceAgent, now)
	}
	if len(copies) != 2*h.cfg.Nodes || cut == 0 {
		h.check(fmt.Errorf("the anchor copied %d workloads, want %d, with %d workers on edge nodes", len(copies), 2*h.cfg.Nodes, cut))
	}
	writeAll := func() time.Duration {
		began := time.Now()
		h.check(h.forEach(2*manager.DefaultConcurrentReconciles, len(copies), func(i int) error {
			var err error
			copies[i], err = resource(copies[i]).UpdateStatus(ctx, statusOnly(copies[i]), metav1.UpdateOptions{})
			return err
		}))
		return time.Since(began)
	}
	// kwok leaves every edge node just before the clock starts, as in the outage (cutOff), so that its Lease
	// renewals are not the anchor's to share, and takes them back once the outage has lasted as long as the one
	// measured. The profile and the cost window open before, as the outage's do: the API server's answer to those
	// label patches (their watch events, the garbage they leave) then falls in both clocks alike.
	nodes := h.fleet.nodes()
	profiled := h.profileCPU(ctx, "outage-anchor", 20*time.Second)
	costs := h.openCostWindow()
	h.check(h.labelNodes(ctx, nodes, "null"))
	began := time.Now()
	written := writeAll()
	var seen int
	r.OutageRaw, seen = h.waitRecords(watched, began, edge, "in their agents' word (the anchor's copies)", inAgentsWord)
	if seen != cut {
		h.check(fmt.Errorf("the anchor's copies hold %d workers on edge nodes, want %d", seen, cut))
	}
	h.progress("outage anchor: a client wrote the statuses of %d copies of the workloads (%d workers in their agents' word) in %v, seen in %v",
		len(copies), cut, written.Round(time.Millisecond), r.OutageRaw.Round(time.Millisecond))
	costs.report("outage anchor")
	profiled()

	// The heal's anchor: the same writes, back in the API server's word, while kwok takes every edge node back
	// as in the heal (mend): its label goes on again just before the clock starts, and its renewals of the lapsed
	// Leases and lists of each node's pods share the clock's seconds.
	h.waitOutTheGrace(ctx, "outage anchor", began, nodes)
	now = time.Now().UTC().Format(time.RFC3339)
	for _, c := range copies {
		toWord(c, edge, v1alpha1.StatusSourceAPIServer, now)
	}
	profiled = h.profileCPU(ctx, "heal-anchor", 20*time.Second)
	costs = h.openCostWindow()
	h.check(h.labelNodes(ctx, nodes, `"`+kwokValue+`"`))
	began = time.Now()
	written = writeAll()
	r.HealRaw, _ = h.waitRecords(watched, began, edge, "in the API server's word (the anchor's copies)", inAPIServersWord)
	h.progress("heal anchor: a client wrote the statuses of %d copies back in the API server's word in %v, seen in %v, as kwok took %d nodes back",
		len(copies), written.Round(time.Millisecond), r.HealRaw.Round(time.Millisecond), len(nodes))
	costs.report("heal anchor")
	profiled()
}

// installAnchorCRDs installs Lifeline's CRDs of the workloads under anchorGroup and waits until they serve.
func (h *scaleRun) installAnchorCRDs(ctx context.Context) error {
	client, err := apiextensionsclient.NewForConfig(h.cp.Config)
	if err != nil {
		return err
	}
	crds := client.ApiextensionsV1().CustomResourceDefinitions()
	for _, plural := range anchorPlurals {
		crd, err := crds.Get(ctx, plural+"."+v1alpha1.GroupVersion.Group, metav1.GetOptions{})
		if err != nil {
			return err
		}
		anchor := &apiextensionsv1.CustomResourceDefinition{ObjectMeta: metav1.ObjectMeta{Name: plural + "." + anchorGroup}, Spec: crd.Spec}
		anchor.Spec.Group = anchorGroup
		if _, err := crds.Create(ctx, anchor, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("creating the anchor's CRD %s: %w", anchor.Name, err)
		}
		if err := harness.WaitEstablished(ctx, client, anchor.Name); err != nil {
			return err
		}
	}
	return nil
}

// anchorCopy is workload as a user would create it in the anchor's group and namespace, its status kept.
func anchorCopy(workload *unstructured.Unstructured) *unstructured.Unstructured {
	c := &unstructured.Unstructured{Object: map[string]any{"spec": workload.Object["spec"], "status": workload.Object["status"]}}
	c.SetAPIVersion(anchorGroup + "/v1alpha1")
	c.SetKind(workload.GetKind())
	c.SetName(workload.GetName())
	c.SetNamespace(AnchorNamespace)
	c.SetLabels(workload.GetLabels())
	return c
}

// statusOnly is what the controller sends of u in a status write (workload.StatusWriteMeta): its identity, the
// version it read, and the status.
func statusOnly(u *unstructured.Unstructured) *unstructured.Unstructured {
	c := &unstructured.Unstructured{Object: map[string]any{"status": u.Object["status"]}}
	c.SetAPIVersion(u.GetAPIVersion())
	c.SetKind(u.GetKind())
	c.SetName(u.GetName())
	c.SetNamespace(u.GetNamespace())
	c.SetUID(u.GetUID())
	c.SetResourceVersion(u.GetResourceVersion())
	return c
}

// toWord sets, in u's status, each worker on a node of edge in source's word as the controller does in an outage
// and its heal (source and last seen), and returns how many it set.
func toWord(u *unstructured.Unstructured, edge map[string]bool, source v1alpha1.StatusSource, now string) int {
	workers, _, _ := unstructured.NestedSlice(u.Object, "status", "workers")
	n := 0
	for _, w := range workers {
		record, ok := w.(map[string]any)
		if node, _ := record["node"].(string); ok && edge[node] {
			record["source"], record["lastSeen"] = string(source), now
			n++
		}
	}
	_ = unstructured.SetNestedSlice(u.Object, workers, "status", "workers")
	return n
}

// watchAnchor starts a cache of the anchor's copies, typed as the harness's cache holds the workloads, and returns
// it with the function that stops it. The anchor's clocks stop when this observer has seen every write, as the
// outage's and the heal's stop when the harness's cache has: the watch events' serving, their decoding and the
// polling of the records then fall in both clocks alike, and so does the time from a write's answer to its event.
func (h *scaleRun) watchAnchor(ctx context.Context) (workloadsIn, context.CancelFunc) {
	scheme := runtime.NewScheme()
	scheme.AddKnownTypes(anchorVersion, &v1alpha1.JointInferenceService{}, &v1alpha1.JointInferenceServiceList{},
		&v1alpha1.FederatedLearningJob{}, &v1alpha1.FederatedLearningJobList{})
	metav1.AddToGroupVersion(scheme, anchorVersion)
	cfg := rest.CopyConfig(h.cp.Config)
	cfg.QPS = -1
	watched, err := cache.New(cfg, cache.Options{Scheme: scheme, DefaultNamespaces: map[string]cache.Config{AnchorNamespace: {}}})
	h.check(err)
	for _, obj := range []client.Object{&v1alpha1.JointInferenceService{}, &v1alpha1.FederatedLearningJob{}} {
		_, err := watched.GetInformer(ctx, obj)
		h.check(err)
	}
	ctx, stop := context.WithCancel(ctx)
	go func() { _ = watched.Start(ctx) }()
	if !watched.WaitForCacheSync(ctx) {
		stop()
		h.check(fmt.Errorf("the cache of the anchor's copies did not sync"))
	}
	return workloadsIn{watched, AnchorNamespace}, stop
}
