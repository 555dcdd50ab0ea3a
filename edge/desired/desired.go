// Package desired knows which workers belong on this node: the pods bound to it that carry Lifeline's role
// label, from a list/watch of the API server (or of KubeEdge's MetaServer, which serves the same API from the
// node). It keeps them on disk, so an agent restarted while the API server is out of reach still knows its
// workers, and it says whether the API server is reachable right now.
package desired

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"

	"github.com/lifeline-edge/lifeline/cloud/contract"
)

// PodSource lists and watches pods; *PodClient is the real one.
type PodSource interface {
	List(ctx context.Context, opts metav1.ListOptions) (*corev1.PodList, error)
	Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
}

// PodClient reads pods of all namespaces with a REST client that knows only core/v1: the agent stays small,
// without the typed clients of every API group.
type PodClient struct{ rest *rest.RESTClient }

// NewPodClient builds a PodClient for cfg.
func NewPodClient(cfg *rest.Config) (*PodClient, error) {
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	metav1.AddToGroupVersion(scheme, schema.GroupVersion{Version: "v1"})
	c := rest.CopyConfig(cfg)
	c.APIPath, c.GroupVersion = "/api", &corev1.SchemeGroupVersion
	c.NegotiatedSerializer = serializer.NewCodecFactory(scheme).WithoutConversion()
	if c.UserAgent == "" {
		c.UserAgent = "lifeline-agent"
	}
	rc, err := rest.RESTClientFor(c)
	if err != nil {
		return nil, fmt.Errorf("building the pod client: %w", err)
	}
	return &PodClient{rest: rc}, nil
}

// List lists pods.
func (c *PodClient) List(ctx context.Context, opts metav1.ListOptions) (*corev1.PodList, error) {
	out := &corev1.PodList{}
	err := c.rest.Get().Resource("pods").VersionedParams(&opts, metav1.ParameterCodec).Do(ctx).Into(out)
	return out, err
}

// Watch watches pods.
func (c *PodClient) Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	opts.Watch = true
	return c.rest.Get().Resource("pods").VersionedParams(&opts, metav1.ParameterCodec).Watch(ctx)
}

// Worker is one worker pod bound to this node.
type Worker struct {
	Namespace     string `json:"namespace"`
	Name          string `json:"name"`
	UID           string `json:"uid"`
	Role          string `json:"role"`
	OfflinePolicy string `json:"offlinePolicy,omitempty"`
}

// Watcher follows the node's worker pods.
type Watcher struct {
	pods PodSource
	node string
	path string
	log  logr.Logger

	mu        sync.Mutex
	workers   map[string]Worker // by UID
	reachable bool
}

// New returns a watcher that keeps its workers in stateDir/desired-workers.json, loading what is there now.
func New(pods PodSource, node, stateDir string, log logr.Logger) (*Watcher, error) {
	w := &Watcher{pods: pods, node: node, path: filepath.Join(stateDir, "desired-workers.json"), log: log,
		workers: map[string]Worker{}}
	data, err := os.ReadFile(w.path)
	switch {
	case os.IsNotExist(err):
	case err != nil:
		return nil, fmt.Errorf("reading %s: %w", w.path, err)
	default:
		var list []Worker
		if err := json.Unmarshal(data, &list); err != nil {
			return nil, fmt.Errorf("decoding %s: %w", w.path, err)
		}
		for _, wk := range list {
			w.workers[wk.UID] = wk
		}
	}
	return w, nil
}

// Workers lists the node's workers, sorted by namespace and name.
func (w *Watcher) Workers() []Worker {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]Worker, 0, len(w.workers))
	for _, wk := range w.workers {
		out = append(out, wk)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Namespace+"/"+out[i].Name < out[j].Namespace+"/"+out[j].Name })
	return out
}

// Has tells whether a pod UID is one of the node's workers.
func (w *Watcher) Has(uid string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	_, ok := w.workers[uid]
	return ok
}

// Reachable tells whether the watch of the API server is established now.
func (w *Watcher) Reachable() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.reachable
}

// Run lists and watches until ctx ends, retrying every retry while the API server is out of reach.
func (w *Watcher) Run(ctx context.Context, retry time.Duration) {
	pods := w.pods
	opts := metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("spec.nodeName", w.node).String(), LabelSelector: contract.RoleLabel}
	for ctx.Err() == nil {
		list, err := pods.List(ctx, opts)
		if err != nil {
			w.setReachable(false)
			w.log.V(2).Info("API server unreachable", "error", err.Error())
			sleep(ctx, retry)
			continue
		}
		w.replace(list.Items)
		watchOpts := opts
		watchOpts.ResourceVersion = list.ResourceVersion
		watcher, err := pods.Watch(ctx, watchOpts)
		if err != nil {
			w.setReachable(false)
			sleep(ctx, retry)
			continue
		}
		w.setReachable(true)
		for ev := range watcher.ResultChan() {
			pod, ok := ev.Object.(*corev1.Pod)
			if !ok {
				continue
			}
			switch ev.Type {
			case watch.Added, watch.Modified:
				w.put(pod)
			case watch.Deleted:
				w.remove(string(pod.UID))
			}
		}
		watcher.Stop()
		w.setReachable(false)
	}
}

func (w *Watcher) setReachable(v bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.reachable = v
}

func toWorker(p *corev1.Pod) Worker {
	return Worker{Namespace: p.Namespace, Name: p.Name, UID: string(p.UID), Role: p.Labels[contract.RoleLabel],
		OfflinePolicy: p.Annotations[contract.OfflinePolicyAnnotation]}
}

func (w *Watcher) replace(pods []corev1.Pod) {
	w.mu.Lock()
	w.workers = map[string]Worker{}
	for i := range pods {
		w.workers[string(pods[i].UID)] = toWorker(&pods[i])
	}
	w.mu.Unlock()
	w.save()
}

func (w *Watcher) put(p *corev1.Pod) {
	w.mu.Lock()
	old, had := w.workers[string(p.UID)]
	w.workers[string(p.UID)] = toWorker(p)
	changed := !had || old != toWorker(p)
	w.mu.Unlock()
	if changed {
		w.save()
	}
}

func (w *Watcher) remove(uid string) {
	w.mu.Lock()
	delete(w.workers, uid)
	w.mu.Unlock()
	w.save()
}

// save writes the workers atomically (a temporary file renamed over the old one).
func (w *Watcher) save() {
	data, err := json.Marshal(w.Workers())
	if err == nil {
		tmp := w.path + ".tmp"
		if err = os.WriteFile(tmp, data, 0o600); err == nil {
			err = os.Rename(tmp, w.path)
		}
	}
	if err != nil {
		w.log.Error(err, "saving the desired workers", "path", w.path)
	}
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
