package edgesim

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// restartResponse is the body KubeEdge's MetaServer answers a pods/restart call with.
type restartResponse struct {
	LogMessages []string `json:"logMessages"`
	ErrMessages []string `json:"errMessages"`
}

// ServeMetaServer serves the part of KubeEdge's MetaServer the edge agent uses, from the node's own state, so it
// answers while the node is cut off from the API server:
//   - GET /api/v1/pods: the pods the node runs (a PodList);
//   - POST /api/v1/namespaces/<ns>/pods/restart with a JSON list of pod names (what `keadm ctl restart pod`
//     sends): their containers are restarted at once, without waiting for a crash back-off.
func (n *Node) ServeMetaServer(ctx context.Context, l net.Listener) error {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /api/v1/pods", n.serveListPods)
	mux.HandleFunc("POST /api/v1/namespaces/{namespace}/pods/restart", n.serveRestartPods)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { <-ctx.Done(); _ = srv.Close() }()
	if err := srv.Serve(l); err != nil && err != http.ErrServerClosed {
		return fmt.Errorf("serving the MetaServer subset: %w", err)
	}
	return nil
}

func (n *Node) serveListPods(w http.ResponseWriter, _ *http.Request) {
	list := &corev1.PodList{TypeMeta: metav1.TypeMeta{Kind: "PodList", APIVersion: "v1"}}
	n.mu.Lock()
	for _, rt := range n.pods {
		rt.mu.Lock()
		pod := rt.pod.DeepCopy()
		if rt.reported != nil {
			pod.Status = *rt.reported.DeepCopy()
		}
		rt.mu.Unlock()
		list.Items = append(list.Items, *pod)
	}
	n.mu.Unlock()
	sort.Slice(list.Items, func(i, j int) bool {
		return list.Items[i].Namespace+"/"+list.Items[i].Name < list.Items[j].Namespace+"/"+list.Items[j].Name
	})
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(list)
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

// RestartPod stops the containers of a pod and starts them again at once, as edged does for a pods/restart call.
func (n *Node) RestartPod(namespace, name string) error {
	var rt *podRuntime
	n.mu.Lock()
	for _, candidate := range n.pods {
		candidate.mu.Lock()
		if candidate.pod.Namespace == namespace && candidate.pod.Name == name && candidate.pod.DeletionTimestamp == nil {
			rt = candidate
		}
		candidate.mu.Unlock()
	}
	n.mu.Unlock()
	if rt == nil {
		return fmt.Errorf("pod %s/%s is not on this node", namespace, name)
	}
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
