// Package desired knows which workers belong on this node: the pods bound to it that carry Lifeline's role
// label, from a list/watch of the API server (or of KubeEdge's MetaServer, which serves the same API from the
// node). It keeps them on disk, so an agent restarted while the API server is out of reach still knows its
// workers, and it says whether the API server is reachable right now.
package desired

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/go-logr/logr"

	"github.com/lifeline-edge/lifeline/edge/statefile"
	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
)

// PodSource lists and watches pods; *PodClient is the real one.
type PodSource interface {
	// List calls each with every pod sel selects, one at a time, and returns the list's resource version.
	List(ctx context.Context, sel Selector, each func(*Pod)) (string, error)
	Watch(ctx context.Context, sel Selector, resourceVersion string) (<-chan Event, error)
}

// RestartAlways is the pod restart policy under which the node's kubelet restarts a container whatever its exit
// code, and the API's default.
const RestartAlways = "Always"

// Worker is one worker pod bound to this node.
type Worker struct {
	Namespace     string `json:"namespace"`
	Name          string `json:"name"`
	UID           string `json:"uid"`
	Role          string `json:"role"`
	OfflinePolicy string `json:"offlinePolicy,omitempty"`
	// RestartPolicy is the pod's (Always when the pod does not say): a worker that exits 0 is dead for Always,
	// done for OnFailure and Never.
	RestartPolicy string `json:"restartPolicy,omitempty"`
	// WorkerName is the pod's WORKER_NAME, the name its Sedna reports carry: the pod's own name for FL workers,
	// the Deployment's for JI workers.
	WorkerName string `json:"workerName,omitempty"`
	// Started: the pod's phase says the node ran it (Running, or Failed): a worker the runtime then does not
	// hold was lost by the node, where one not yet started is only on its way.
	Started bool `json:"started,omitempty"`
	// Manifest is the worker's pod as a static-pod manifest (metadata and spec, no node, no status), so the
	// agent can rebuild a worker whose pod the node lost while cut off; "" when the agent keeps none.
	Manifest string `json:"manifest,omitempty"`
	// ManifestRefused says why the agent keeps no manifest of the worker (its pod is beyond the agent's bounds):
	// the worker is reported as any other, but gets no stand-in.
	ManifestRefused string `json:"manifestRefused,omitempty"`
	// Dataset, DatasetIndex and DatasetFormat are a trainer's Dataset: its name, its index file on the node and
	// the file's format, from the pod's marks; empty for other workers.
	Dataset       string `json:"dataset,omitempty"`
	DatasetIndex  string `json:"datasetIndex,omitempty"`
	DatasetFormat string `json:"datasetFormat,omitempty"`
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
	dropped   int               // the node's worker pods of the latest list not kept: beyond MaxWorkers or MaxDesiredBytes
	reachable bool
	answered  bool // a list or watch has ended, so reachable means something
	refused   bool // the latest answer was a refusal (401, 403): logged once per streak
}

// New returns a watcher that keeps its workers in stateDir/desired-workers.json, loading what is there now. A
// file that does not decode (a torn write, a full disk) is moved aside as desired-workers.json.corrupt-<time>
// and the watcher starts with no workers: the next list refills them, and an agent that refused to start would
// heal nothing. A file larger than the bound (written by an agent that had none) is read only up to it: the
// workers found there are kept, within the bounds, and the next save writes the file anew.
func New(pods PodSource, node, stateDir string, log logr.Logger) (*Watcher, error) {
	w := &Watcher{pods: pods, node: node, path: filepath.Join(stateDir, "desired-workers.json"), log: log,
		workers: map[string]Worker{}}
	f, err := os.Open(w.path)
	switch {
	case os.IsNotExist(err):
		return w, nil
	case err != nil:
		return nil, fmt.Errorf("reading %s: %w", w.path, err)
	}
	defer f.Close()
	list, err := readSaved(f)
	if errors.Is(err, errSavedTooLarge) {
		log.Error(err, "the desired workers on disk are beyond the agent's bound; keeping those read within it", "path", w.path, "kept", len(list))
		err = nil
	}
	if err != nil {
		aside := fmt.Sprintf("%s.corrupt-%s", w.path, time.Now().UTC().Format("20060102T150405.000000000Z"))
		if mvErr := os.Rename(w.path, aside); mvErr != nil {
			return nil, fmt.Errorf("moving the undecodable %s aside: %w", w.path, errors.Join(err, mvErr))
		}
		log.Error(err, "the desired workers on disk do not decode; moved aside, starting with none", "path", w.path, "movedTo", aside)
		return w, nil
	}
	for _, wk := range list {
		w.workers[wk.UID] = wk
	}
	w.dropped = bound(w.workers)
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

// Completes tells whether the worker with that UID completes when it exits 0 (restartPolicy OnFailure or Never),
// rather than being restarted by the node.
func (w *Watcher) Completes(uid string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	wk, ok := w.workers[uid]
	return ok && wk.RestartPolicy != RestartAlways && wk.RestartPolicy != ""
}

// HasWorker tells whether namespace/name names one of the node's workers, by pod name or by WORKER_NAME (the
// name Sedna reports carry: a JI worker reports under its Deployment's name).
func (w *Watcher) HasWorker(namespace, name string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, wk := range w.workers {
		if wk.Namespace == namespace && (wk.Name == name || wk.WorkerName == name) {
			return true
		}
	}
	return false
}

// Answered tells whether a list or watch has succeeded or failed yet: before, Reachable means nothing.
func (w *Watcher) Answered() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.answered
}

// Reachable tells whether the watch of the API server is established now.
func (w *Watcher) Reachable() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.reachable
}

// Run lists and watches until ctx ends, retrying every retry while the API server is out of reach. An API
// server that answers but refuses (401, 403: a token being rotated, RBAC being changed) is reachable: the node
// is not cut off, so nothing is healed locally; the refusal is logged and the request retried.
func (w *Watcher) Run(ctx context.Context, retry time.Duration) {
	for ctx.Err() == nil {
		pods, resourceVersion, sel, err := w.list(ctx)
		if err != nil {
			w.failed(err)
			sleep(ctx, retry)
			continue
		}
		w.replace(pods)
		// Each watch has a context of its own: one that follow leaves (a hold ended) is closed, not left holding
		// its connection and its reader until the agent stops.
		watchCtx, stopWatch := context.WithCancel(ctx)
		events, err := w.pods.Watch(watchCtx, sel, resourceVersion)
		if err != nil {
			stopWatch()
			w.failed(err)
			sleep(ctx, retry)
			continue
		}
		w.setReachable(true)
		w.follow(events)
		stopWatch()
		// The watch ended: by the server's timeout (the list that follows succeeds), because the link broke
		// (the list fails, and says so), or because a hold ended (the list that follows is the word to take).
	}
}

// list lists the node's worker pods (at most MaxWorkers of them, the rest counted) and returns the list's
// resource version and the selector that found them, for the watch. The node's field selector narrows what an
// API server sends, but a cut-off KubeEdge node's MetaServer answers from its local store, which matches metadata
// fields only and lists nothing for spec.nodeName: when the narrow list finds no worker and the source does not
// select by node, the label selector is tried alone, and watched alone (a narrow watch of that store would never
// see a worker arrive). Either way only pods bound to this node are kept (see ours): a connected MetaServer
// forwards to cloudcore and lists every node's pods.
func (w *Watcher) list(ctx context.Context) (listed, string, Selector, error) {
	narrow := Selector{Fields: "spec.nodeName=" + w.node, Labels: lifelinev1.RoleLabel}
	pods, resourceVersion, err := w.listOurs(ctx, narrow)
	if err != nil || len(pods.workers) > 0 || pods.dropped > 0 || w.selectsByNode(ctx) {
		return pods, resourceVersion, narrow, err
	}
	wide := Selector{Labels: lifelinev1.RoleLabel}
	pods, resourceVersion, err = w.listOurs(ctx, wide)
	return pods, resourceVersion, wide, err
}

// listed is what a list found of the node's workers: those kept, and how many more there were.
type listed struct {
	workers []Worker
	dropped int
}

// listOurs lists the pods sel selects and keeps those that are the node's workers, up to MaxWorkers.
func (w *Watcher) listOurs(ctx context.Context, sel Selector) (listed, string, error) {
	var out listed
	resourceVersion, err := w.pods.List(ctx, sel, func(p *Pod) {
		switch {
		case !w.ours(p):
		case len(out.workers) < MaxWorkers:
			out.workers = append(out.workers, toWorker(p))
		default:
			out.dropped++
		}
	})
	return out, resourceVersion, err
}

// selectsByNode tells whether the source selects pods by node: it lists one of the node's pods (the agent's own,
// where it runs as a pod) by the node's field selector alone. Then the narrow list's word that the node has no
// worker is true, and the wide watch must not be taken: a connected MetaServer keeps every pod such a watch
// delivers in the node's store, other nodes' too, and every idle node would get every worker change in the
// cluster. A node with no pod at all cannot tell, and takes the wide watch.
func (w *Watcher) selectsByNode(ctx context.Context) bool {
	found := false
	_, err := w.pods.List(ctx, Selector{Fields: "spec.nodeName=" + w.node}, func(p *Pod) {
		found = found || p.Spec.NodeName == w.node
	})
	return err == nil && found
}

// ours tells whether a listed or watched pod is bound to this node.
// ours: bound to this node, and neither a mirror pod nor one of the agent's stand-ins. A mirror pod is the API
// server's copy of one of the node's static pods; the agent's stand-in for a worker carries the worker's labels
// and is marked with StaticPodOfAnnotation, which its mirror (or a node listing its static pods) shows too. The
// node runs those from its manifest directory, never from the API server: no worker for the agent to watch,
// report or rebuild.
func (w *Watcher) ours(p *Pod) bool {
	a := p.Metadata.Annotations
	return p.Spec.NodeName == w.node && a[mirrorAnnotation] == "" && a[lifelinev1.StaticPodOfAnnotation] == ""
}

// mirrorAnnotation marks a mirror pod (Kubernetes' kubetypes.ConfigMirrorAnnotationKey).
const mirrorAnnotation = "kubernetes.io/config.mirror"

// failed records a failed list or watch: a refusal means reachable, anything else unreachable.
func (w *Watcher) failed(err error) {
	var refused *RefusedError
	if !errors.As(err, &refused) {
		w.setReachable(false)
		w.log.V(2).Info("API server unreachable", "error", err.Error())
		return
	}
	w.mu.Lock()
	w.reachable, w.answered = true, true
	first := !w.refused
	w.refused = true
	w.mu.Unlock()
	if first {
		w.log.Error(err, "the API server refuses the agent's requests; retrying")
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
				if w.ours(&ev.Pod) {
					w.put(&ev.Pod)
				}
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
	w.reachable, w.refused, w.answered = v, false, true
}

func toWorker(p *Pod) Worker {
	m := p.Metadata
	restart := p.Spec.RestartPolicy
	if restart == "" {
		restart = RestartAlways
	}
	wk := Worker{Namespace: m.Namespace, Name: m.Name, UID: m.UID, Role: m.Labels[lifelinev1.RoleLabel],
		OfflinePolicy: m.Annotations[lifelinev1.OfflinePolicyAnnotation], RestartPolicy: restart, WorkerName: WorkerNameOf(p), Manifest: p.Manifest,
		Started: p.Status.Phase == "Running" || p.Status.Phase == "Failed",
		Dataset: m.Annotations[lifelinev1.DatasetAnnotation], DatasetIndex: m.Annotations[lifelinev1.DatasetIndexAnnotation],
		DatasetFormat: m.Annotations[lifelinev1.DatasetFormatAnnotation]}
	if p.Manifest == "" && p.ManifestBytes > MaxManifestBytes {
		wk.ManifestRefused = manifestTooLarge(p.ManifestBytes)
	}
	return wk
}

// WorkerNameOf is the WORKER_NAME of the pod's first container that sets it as a plain value (the name its Sedna
// reports carry), or "".
func WorkerNameOf(p *Pod) string {
	for _, c := range p.Spec.Containers {
		for _, e := range c.Env {
			if e.Name == "WORKER_NAME" {
				return e.Value
			}
		}
	}
	return ""
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

func (w *Watcher) replace(pods listed) {
	held := w.holding()
	w.mu.Lock()
	before := w.workers
	w.workers = make(map[string]Worker, len(pods.workers))
	if held {
		maps.Copy(w.workers, before)
	}
	for _, wk := range pods.workers {
		w.workers[wk.UID] = wk
	}
	w.dropped = pods.dropped + bound(w.workers)
	w.mu.Unlock()
	w.tellRefused(before)
	w.save()
}

func (w *Watcher) put(p *Pod) {
	wk := toWorker(p)
	w.mu.Lock()
	before := w.workers
	old, had := before[wk.UID]
	if !had && len(before) >= MaxWorkers {
		w.mu.Unlock()
		return // counted by the next list
	}
	w.workers = maps.Clone(before)
	w.workers[wk.UID] = wk
	bound(w.workers)
	changed := !had || old != w.workers[wk.UID]
	w.mu.Unlock()
	if changed {
		w.tellRefused(before)
		w.save()
	}
}

func (w *Watcher) remove(uid string) {
	w.mu.Lock()
	delete(w.workers, uid)
	w.mu.Unlock()
	w.save()
}

// save writes the workers durably: whole, or not at all.
func (w *Watcher) save() {
	data, err := json.Marshal(w.Workers())
	if err == nil {
		err = statefile.Write(w.path, data)
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
