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

	"github.com/lifeline-edge/lifeline/cloud/contract/marks"
)

// PodSource lists and watches pods; *PodClient is the real one.
type PodSource interface {
	List(ctx context.Context, sel Selector) (*PodList, error)
	Watch(ctx context.Context, sel Selector, resourceVersion string) (<-chan Event, error)
}

// Worker is one worker pod bound to this node.
type Worker struct {
	Namespace     string `json:"namespace"`
	Name          string `json:"name"`
	UID           string `json:"uid"`
	Role          string `json:"role"`
	OfflinePolicy string `json:"offlinePolicy,omitempty"`
	// Manifest is the worker's pod as a static-pod manifest (metadata and spec, no node, no status), so the
	// agent can rebuild a worker whose pod the node lost while cut off.
	Manifest string `json:"manifest,omitempty"`
}

// Watcher follows the node's worker pods.
type Watcher struct {
	// Hold, when set and true, keeps workers that the source stops listing: with KubeEdge's MetaServer as the
	// source, a pod that vanishes while the node is cut off from the cloud was lost by the node, not deleted by
	// the cloud (whose deletions cannot arrive then), and is still a worker to heal. Once Hold turns false the
	// source is listed again and its word stands.
	Hold func() bool

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
	sel := Selector{Fields: "spec.nodeName=" + w.node, Labels: marks.RoleLabel}
	for ctx.Err() == nil {
		list, err := w.pods.List(ctx, sel)
		if err != nil {
			w.setReachable(false)
			w.log.V(2).Info("API server unreachable", "error", err.Error())
			sleep(ctx, retry)
			continue
		}
		w.replace(list.Items)
		events, err := w.pods.Watch(ctx, sel, list.Metadata.ResourceVersion)
		if err != nil {
			w.setReachable(false)
			sleep(ctx, retry)
			continue
		}
		w.setReachable(true)
		w.follow(events)
		// The watch ended: by the server's timeout (the list that follows succeeds), because the link broke
		// (the list fails, and says so), or because a hold ended (the list that follows is the word to take).
	}
}

// follow applies watch events until the watch ends or a hold ends.
func (w *Watcher) follow(events <-chan Event) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	held := w.holding()
	for {
		select {
		case ev, ok := <-events:
			if !ok {
				return
			}
			switch ev.Type {
			case "ADDED", "MODIFIED":
				w.put(&ev.Pod)
			case "DELETED":
				if held = w.holding(); !held {
					w.remove(ev.Pod.Metadata.UID)
				}
			}
		case <-tick.C:
			if held && !w.holding() {
				return
			}
			held = held || w.holding()
		}
	}
}

func (w *Watcher) holding() bool { return w.Hold != nil && w.Hold() }

func (w *Watcher) setReachable(v bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.reachable = v
}

func toWorker(p *Pod) Worker {
	m := p.Metadata
	return Worker{Namespace: m.Namespace, Name: m.Name, UID: m.UID, Role: m.Labels[marks.RoleLabel],
		OfflinePolicy: m.Annotations[marks.OfflinePolicyAnnotation], Manifest: staticManifest(p.Raw)}
}

// staticManifest keeps of a pod what a static pod of it needs: its name, namespace, labels, annotations and
// spec, without the node it was bound to; "" when the pod cannot be read that way.
func staticManifest(raw json.RawMessage) string {
	var pod struct {
		Metadata struct {
			Name        string            `json:"name"`
			Namespace   string            `json:"namespace"`
			Labels      map[string]string `json:"labels,omitempty"`
			Annotations map[string]string `json:"annotations,omitempty"`
		} `json:"metadata"`
		Spec map[string]json.RawMessage `json:"spec"`
	}
	if len(raw) == 0 || json.Unmarshal(raw, &pod) != nil || pod.Spec == nil {
		return ""
	}
	delete(pod.Spec, "nodeName")
	out, err := json.Marshal(map[string]any{"apiVersion": "v1", "kind": "Pod", "metadata": pod.Metadata, "spec": pod.Spec})
	if err != nil {
		return ""
	}
	return string(out)
}

func (w *Watcher) replace(pods []Pod) {
	held := w.holding()
	w.mu.Lock()
	if !held {
		w.workers = map[string]Worker{}
	}
	for i := range pods {
		w.workers[pods[i].Metadata.UID] = toWorker(&pods[i])
	}
	w.mu.Unlock()
	w.save()
}

func (w *Watcher) put(p *Pod) {
	w.mu.Lock()
	old, had := w.workers[p.Metadata.UID]
	w.workers[p.Metadata.UID] = toWorker(p)
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
