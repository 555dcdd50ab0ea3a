package edgesim

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// restartResponse is the body KubeEdge's MetaServer answers a pods/restart call with.
type restartResponse struct {
	LogMessages []string `json:"logMessages"`
	ErrMessages []string `json:"errMessages"`
}

// ServeMetaServer serves the part of KubeEdge's MetaServer the edge agent uses, from the node's own state, so it
// answers while the node is cut off from the API server:
//   - GET /api/v1/pods: the pods the node runs (a PodList), narrowed by a labelSelector of `key` and `key=value`
//     terms; with watch=true, a stream of watch events: every pod as ADDED, then what changes;
//   - POST /api/v1/namespaces/<ns>/pods/restart with a JSON list of pod names (what `keadm ctl restart pod`
//     sends): their containers are restarted at once, without waiting for a crash back-off.
func (n *Node) ServeMetaServer(ctx context.Context, l net.Listener) error {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /api/v1/pods", n.serveListPods)
	mux.HandleFunc("POST /api/v1/namespaces/{namespace}/pods/restart", n.serveRestartPods)
	// Not MetaServer's: the simulation's fault injection, a pod the node loses (as an eviction would).
	mux.HandleFunc("POST /debug/lose/{namespace}/{name}", func(w http.ResponseWriter, r *http.Request) {
		if !n.LosePod(r.PathValue("namespace"), r.PathValue("name")) {
			http.Error(w, "no such pod on this node", http.StatusNotFound)
		}
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { <-ctx.Done(); _ = srv.Close() }()
	if err := srv.Serve(l); err != nil && err != http.ErrServerClosed {
		return fmt.Errorf("serving the MetaServer subset: %w", err)
	}
	return nil
}

func (n *Node) serveListPods(w http.ResponseWriter, r *http.Request) {
	selects, err := labelMatcher(r.URL.Query().Get("labelSelector"))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if r.URL.Query().Get("watch") == "true" {
		n.streamPods(w, r, selects)
		return
	}
	list := &corev1.PodList{TypeMeta: metav1.TypeMeta{Kind: "PodList", APIVersion: "v1"}}
	for _, pod := range n.podSnapshot(selects) {
		list.Items = append(list.Items, *pod)
	}
	sort.Slice(list.Items, func(i, j int) bool {
		return list.Items[i].Namespace+"/"+list.Items[i].Name < list.Items[j].Namespace+"/"+list.Items[j].Name
	})
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(list)
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
	namespace := r.PathValue("namespace")
	resp := restartResponse{LogMessages: []string{}, ErrMessages: []string{}}
	for _, name := range names {
		if err := n.RestartPod(namespace, name); err != nil {
			resp.ErrMessages = append(resp.ErrMessages, err.Error())
		} else {
			resp.LogMessages = append(resp.LogMessages, fmt.Sprintf("pod %s/%s restarted", namespace, name))
		}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(resp)
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

// RestartPod stops the containers of a pod and starts them again at once, as edged does for a pods/restart call.
func (n *Node) RestartPod(namespace, name string) error {
	found := n.runtimesWhere(func(pod *corev1.Pod) bool {
		return pod.Namespace == namespace && pod.Name == name && pod.DeletionTimestamp == nil
	})
	if len(found) == 0 {
		return fmt.Errorf("pod %s/%s is not on this node", namespace, name)
	}
	rt := found[0]
	rt.mu.Lock()
	var running []*process
	for _, c := range rt.pod.Spec.Containers {
		rt.restartNow[c.Name] = true
		if p := rt.procs[c.Name]; p != nil {
			running = append(running, p)
		}
	}
	rt.mu.Unlock()
	for _, p := range running {
		p.stop(2 * time.Second)
	}
	return nil
}
