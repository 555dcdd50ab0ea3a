package simnode

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// DefaultMetaServerAddress is where edgecore's MetaServer listens unless configured otherwise: plain HTTP on the
// node's loopback, without authentication (KubeEdge source, common/constants/default.go).
const DefaultMetaServerAddress = "127.0.0.1:10550"

// cloudCallTimeout bounds a MetaServer request that goes to the cloud, after which it is answered locally.
const cloudCallTimeout = 2 * time.Second

// restartResponse is the body KubeEdge's MetaServer answers a pods/restart call with (KubeEdge source,
// common/types/types.go): note the capital L, and that an empty list is left out.
type restartResponse struct {
	ErrMessages []string `json:"errMessages,omitempty"`
	LogMessages []string `json:"LogMessages,omitempty"`
}

// ServeMetaServer serves the part of KubeEdge's MetaServer the edge agent uses, as edgecore does:
//   - GET /api/v1/pods: while the node reaches the cloud, the cloud's answer, for every node (the request's
//     fieldSelector and labelSelector apply as the API server applies them), every pod of it kept in the node's
//     store; while it is cut off, the node's own store, where a labelSelector of `key` and `key=value` terms
//     works and any fieldSelector selects nothing.
//     With watch=true, a stream that ignores the resourceVersion asked for: every selected pod as ADDED, then
//     what changes;
//   - POST /api/v1/namespaces/<ns>/pods/restart with a JSON list of pod names (what `keadm ctl restart pod`
//     sends): their containers are stopped, and the node restarts them under its crash back-off.
func (n *Node) ServeMetaServer(ctx context.Context, l net.Listener) error {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /api/v1/pods", n.serveListPods)
	mux.HandleFunc("POST /api/v1/namespaces/{namespace}/pods/restart", n.serveRestartPods)
	// Not MetaServer's: the simulation's fault injection, a pod the node loses (as an eviction would), and exited
	// containers whose finish time the runtime stamps again (as edgemark's fake runtime does on every stop).
	mux.HandleFunc("POST /debug/lose/{namespace}/{name}", func(w http.ResponseWriter, r *http.Request) {
		if !n.LosePod(r.PathValue("namespace"), r.PathValue("name")) {
			http.Error(w, "no such pod on this node", http.StatusNotFound)
		}
	})
	mux.HandleFunc("POST /debug/restamp/{namespace}/{name}", func(w http.ResponseWriter, r *http.Request) {
		if !n.RestampExited(r.PathValue("namespace"), r.PathValue("name")) {
			http.Error(w, "no exited container of that pod on this node", http.StatusNotFound)
		}
	})
	// edgehub's late notice of a cut and the mirror-pod wait it makes (ImitateEdgehub), as Go durations.
	mux.HandleFunc("POST /debug/edgehub", func(w http.ResponseWriter, r *http.Request) {
		notice, err1 := time.ParseDuration(r.URL.Query().Get("noticeAfter"))
		timeout, err2 := time.ParseDuration(r.URL.Query().Get("mirrorPodTimeout"))
		if err1 != nil || err2 != nil {
			http.Error(w, "noticeAfter and mirrorPodTimeout must be durations", http.StatusBadRequest)
			return
		}
		n.ImitateEdgehub(notice, timeout)
	})
	// edgehub's reconnect cycle (ImitateEdgehubReconnect), as a Go duration; 0s turns it off.
	mux.HandleFunc("POST /debug/edgehub-reconnect", func(w http.ResponseWriter, r *http.Request) {
		cycle, err := time.ParseDuration(r.URL.Query().Get("retryCycle"))
		if err != nil || cycle < 0 {
			http.Error(w, "retryCycle must be a duration, 0s or more", http.StatusBadRequest)
			return
		}
		n.ImitateEdgehubReconnect(cycle)
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { <-ctx.Done(); _ = srv.Close() }()
	if err := srv.Serve(l); err != nil && err != http.ErrServerClosed {
		return fmt.Errorf("serving the MetaServer subset: %w", err)
	}
	return nil
}

func (n *Node) serveListPods(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	opts := metav1.ListOptions{LabelSelector: q.Get("labelSelector"), FieldSelector: q.Get("fieldSelector")}
	watching := q.Get("watch") == "true" || q.Get("watch") == "1"
	if n.cloudLinked.Load() {
		var err error
		if watching {
			err = n.watchThroughCloud(w, r, opts)
		} else {
			err = n.listThroughCloud(w, r, opts)
		}
		var status apierrors.APIStatus
		if errors.As(err, &status) {
			http.Error(w, err.Error(), int(status.Status().Code))
			return
		}
		if err == nil {
			return
		}
		// The cloud did not answer: the node's store does, as edgecore falls back to its local storage.
	}
	selects, err := localSelector(opts)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if watching {
		n.streamPods(w, r, selects)
		return
	}
	list := &corev1.PodList{TypeMeta: metav1.TypeMeta{Kind: "PodList", APIVersion: "v1"}, Items: []corev1.Pod{}}
	for _, pod := range n.podSnapshot(selects) {
		list.Items = append(list.Items, *pod)
	}
	sort.Slice(list.Items, func(i, j int) bool {
		return list.Items[i].Namespace+"/"+list.Items[i].Name < list.Items[j].Namespace+"/"+list.Items[j].Name
	})
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(list)
}

// listThroughCloud answers a list from the API server, unscoped to this node: edgecore forwards it to
// cloudcore, which lists with its own rights.
func (n *Node) listThroughCloud(w http.ResponseWriter, r *http.Request, opts metav1.ListOptions) error {
	ctx, cancel := context.WithTimeout(r.Context(), cloudCallTimeout)
	defer cancel()
	selected, err := cloudSelector(opts)
	if err != nil {
		return err
	}
	list, err := n.cfg.Client.CoreV1().Pods("").List(ctx, opts)
	if err != nil {
		return fmt.Errorf("listing pods through the cloud: %w", err)
	}
	kept := list.Items[:0]
	for i := range list.Items {
		if selected(&list.Items[i]) {
			n.keepInStore(watch.Added, &list.Items[i])
			kept = append(kept, list.Items[i])
		}
	}
	list.Items = kept
	list.TypeMeta = metav1.TypeMeta{Kind: "PodList", APIVersion: "v1"}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(list)
	return nil
}

// watchThroughCloud streams a watch of the API server, unscoped to this node and whatever resourceVersion was
// asked for: every selected pod first, as ADDED, then what changes, until the cloud ends it (the link broke) or the
// client leaves.
func (n *Node) watchThroughCloud(w http.ResponseWriter, r *http.Request, opts metav1.ListOptions) error {
	listCtx, cancel := context.WithTimeout(r.Context(), cloudCallTimeout)
	defer cancel()
	selected, err := cloudSelector(opts)
	if err != nil {
		return err
	}
	pods := n.cfg.Client.CoreV1().Pods("")
	list, err := pods.List(listCtx, opts)
	if err != nil {
		return fmt.Errorf("listing pods through the cloud for a watch: %w", err)
	}
	opts.ResourceVersion = list.ResourceVersion
	watcher, err := pods.Watch(r.Context(), opts)
	if err != nil {
		return fmt.Errorf("watching pods through the cloud: %w", err)
	}
	defer watcher.Stop()
	flusher, _ := w.(http.Flusher)
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	for i := range list.Items {
		if !selected(&list.Items[i]) {
			continue
		}
		n.keepInStore(watch.Added, &list.Items[i])
		if err := enc.Encode(map[string]any{"type": watch.Added, "object": &list.Items[i]}); err != nil {
			return nil // the client left
		}
	}
	if flusher != nil {
		flusher.Flush()
	}
	for ev := range watcher.ResultChan() {
		pod, ok := ev.Object.(*corev1.Pod)
		if ok && !selected(pod) {
			continue
		}
		if ok {
			n.keepInStore(ev.Type, pod)
		}
		if err := enc.Encode(map[string]any{"type": ev.Type, "object": ev.Object}); err != nil {
			return nil
		}
		if flusher != nil {
			flusher.Flush()
		}
	}
	return nil
}

// cloudSelector is the selection the API server applies, by labels and by the pod fields the agent selects on;
// the API server applied it already, a fake client does not.
func cloudSelector(opts metav1.ListOptions) (func(*corev1.Pod) bool, error) {
	byLabels, err := labels.Parse(opts.LabelSelector)
	if err != nil {
		return nil, apierrors.NewBadRequest(fmt.Sprintf("label selector %q: %v", opts.LabelSelector, err))
	}
	byFields, err := fields.ParseSelector(opts.FieldSelector)
	if err != nil {
		return nil, apierrors.NewBadRequest(fmt.Sprintf("field selector %q: %v", opts.FieldSelector, err))
	}
	return func(p *corev1.Pod) bool {
		return byLabels.Matches(labels.Set(p.Labels)) && byFields.Matches(fields.Set{
			"metadata.name": p.Name, "metadata.namespace": p.Namespace, "spec.nodeName": p.Spec.NodeName})
	}, nil
}

// keepInStore keeps in the node's store what the cloud sent of another node's pod, as edgecore does; the node's
// own pods are in it already.
func (n *Node) keepInStore(event watch.EventType, pod *corev1.Pod) {
	if pod.Spec.NodeName == n.cfg.NodeName {
		return
	}
	n.foreignMu.Lock()
	defer n.foreignMu.Unlock()
	if event == watch.Deleted {
		delete(n.foreign, pod.UID)
		return
	}
	if n.foreign == nil {
		n.foreign = map[types.UID]*corev1.Pod{}
	}
	n.foreign[pod.UID] = pod.DeepCopy()
}

// CloudLinked tells whether the node's own list and watch of the API server work now: until they do, its
// MetaServer answers from the node's store.
func (n *Node) CloudLinked() bool { return n.cloudLinked.Load() }

// ForeignPodsStored names, as namespace/name, the other nodes' pods the node's store holds.
func (n *Node) ForeignPodsStored() []string {
	n.foreignMu.Lock()
	defer n.foreignMu.Unlock()
	out := make([]string, 0, len(n.foreign))
	for _, p := range n.foreign {
		out = append(out, p.Namespace+"/"+p.Name)
	}
	sort.Strings(out)
	return out
}

// localSelector is the selection the node's store applies while the node is cut off: its labelSelector terms;
// a fieldSelector matches no pod there (measured on real edgecore: `fieldSelector=spec.nodeName=<node>` lists
// nothing offline, the same query without it lists the node's pods).
func localSelector(opts metav1.ListOptions) (func(map[string]string) bool, error) {
	matches, err := labelMatcher(opts.LabelSelector)
	if err != nil || opts.FieldSelector == "" {
		return matches, err
	}
	return func(map[string]string) bool { return false }, nil
}

// podSnapshot copies the pods the node runs that selects accepts, by UID.
func (n *Node) podSnapshot(selects func(map[string]string) bool) map[types.UID]*corev1.Pod {
	out := map[types.UID]*corev1.Pod{}
	n.mu.Lock()
	defer n.mu.Unlock()
	for uid, rt := range n.pods {
		rt.mu.Lock()
		if selects(rt.pod.Labels) {
			pod := rt.pod.DeepCopy()
			if rt.reported != nil {
				pod.Status = *rt.reported.DeepCopy()
			}
			out[uid] = pod
		}
		rt.mu.Unlock()
	}
	n.foreignMu.Lock()
	defer n.foreignMu.Unlock()
	for uid, pod := range n.foreign {
		if _, own := out[uid]; !own && selects(pod.Labels) {
			out[uid] = pod.DeepCopy()
		}
	}
	return out
}

// streamPods serves a watch: ADDED for every pod now, then ADDED, MODIFIED and DELETED as the node's pods change,
// checked every sync interval, until the client leaves.
func (n *Node) streamPods(w http.ResponseWriter, r *http.Request, selects func(map[string]string) bool) {
	flusher, _ := w.(http.Flusher)
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	seen := map[types.UID]*corev1.Pod{}
	for {
		now := n.podSnapshot(selects)
		for uid, pod := range now {
			old, had := seen[uid]
			switch {
			case !had:
				_ = enc.Encode(map[string]any{"type": "ADDED", "object": pod})
			case old.ResourceVersion != pod.ResourceVersion || !equality.Semantic.DeepEqual(old.Annotations, pod.Annotations):
				_ = enc.Encode(map[string]any{"type": "MODIFIED", "object": pod})
			}
		}
		for uid, pod := range seen {
			if _, still := now[uid]; !still {
				_ = enc.Encode(map[string]any{"type": "DELETED", "object": pod})
			}
		}
		seen = now
		if flusher != nil {
			flusher.Flush()
		}
		select {
		case <-r.Context().Done():
			return
		case <-time.After(n.cfg.SyncInterval):
		}
	}
}

// labelMatcher parses a label selector of comma-separated `key` and `key=value` terms, the subset the agent uses.
func labelMatcher(selector string) (func(map[string]string) bool, error) {
	type term struct {
		key, value string
		exists     bool
	}
	var terms []term
	for _, t := range strings.Split(selector, ",") {
		switch key, value, hasValue := strings.Cut(strings.TrimSpace(t), "="); {
		case key == "" && !hasValue:
		case strings.ContainsAny(key, "!<>() ") || strings.Contains(value, "="):
			return nil, fmt.Errorf("label selector %q: only key and key=value terms are served here", selector)
		default:
			terms = append(terms, term{key: key, value: value, exists: !hasValue})
		}
	}
	return func(labels map[string]string) bool {
		for _, t := range terms {
			v, ok := labels[t.key]
			if !ok || (!t.exists && v != t.value) {
				return false
			}
		}
		return true
	}, nil
}

func (n *Node) serveRestartPods(w http.ResponseWriter, r *http.Request) {
	var names []string
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<16)).Decode(&names); err != nil {
		http.Error(w, "the body must be a JSON list of pod names: "+err.Error(), http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(n.restartPods(r.PathValue("namespace"), names))
}

// restartPods answers a pods/restart call as edgecore's MetaServer does (KubeEdge source,
// edge/pkg/metamanager/metaserver/kubernetes/storage/storage.go, Restart): for each pod, the containers the
// runtime has for it are stopped; a pod without any is "not found". Nothing is started here.
func (n *Node) restartPods(namespace string, names []string) restartResponse {
	var resp restartResponse
	for _, name := range names {
		if n.StopPod(namespace, name) {
			resp.LogMessages = append(resp.LogMessages, fmt.Sprintf("the pod \"%s/%s\" restart successful", namespace, name))
		} else {
			resp.ErrMessages = append(resp.ErrMessages, fmt.Sprintf("not found pod:\"/%s/%s\"", namespace, name))
		}
	}
	return resp
}

// LosePod makes the node forget a pod it runs, processes and state, without the API server knowing: what an
// eviction or a lost local store would do. It tells whether the pod was there.
func (n *Node) LosePod(namespace, name string) bool {
	found := n.runtimesWhere(func(pod *corev1.Pod) bool { return pod.Namespace == namespace && pod.Name == name })
	for _, rt := range found {
		n.forget(rt.pod.UID)
	}
	return len(found) > 0
}

// StopPod kills the running containers of a pod (their exit is a kill's, code 137), as the runtime's
// StopContainer does for a pods/restart call; the node then restarts them by the pod's restart policy, after its
// crash back-off. A container that already exited is left as it is: a runtime does not touch an exited container
// again. StopPod tells whether the node has containers of that pod.
func (n *Node) StopPod(namespace, name string) bool {
	var running []*process
	found := false
	for _, rt := range n.runtimesWhere(func(pod *corev1.Pod) bool { return pod.Namespace == namespace && pod.Name == name }) {
		rt.mu.Lock()
		for _, p := range rt.procs {
			found = true
			running = append(running, p)
		}
		rt.mu.Unlock()
	}
	for _, p := range running {
		p.kill()
	}
	return found
}

// RestampExited stamps the exited containers of a pod with a new finish time, now, as a runtime that re-stamps an
// exited container when it is stopped again would; the container's back-off is not changed by it. It tells
// whether the pod had an exited container.
func (n *Node) RestampExited(namespace, name string) bool {
	found := false
	now := time.Now()
	for _, rt := range n.runtimesWhere(func(pod *corev1.Pod) bool { return pod.Namespace == namespace && pod.Name == name }) {
		rt.mu.Lock()
		for c, p := range rt.procs {
			if p.restamp(now) {
				found = true
				if last := rt.lastExit[c]; last != nil {
					restamped := *last
					restamped.FinishedAt = metav1.NewTime(now) // the same exit, not a new crash
					rt.lastExit[c] = &restamped
				}
			}
		}
		rt.mu.Unlock()
	}
	if found {
		n.containerChanged(runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT)
	}
	return found
}
