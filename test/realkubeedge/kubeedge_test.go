// Package realkubeedge runs Lifeline's scenarios on real KubeEdge nodes: the control plane, cloudcore beside it,
// and edge nodes each running a real edgecore on its own containerd, configured as `keadm join` leaves them
// (test/realnode). cloudcore and edgecore are built by `make tools` from KubeEdge's source archive; without it the
// tests skip, saying why.
package realkubeedge

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/lifeline-edge/lifeline/test/realnode"
	"github.com/lifeline-edge/lifeline/test/testkit"
)

var (
	rc         *realnode.Cluster
	skipReason string
)

// edgeNode is the KubeEdge node of the tests.
const edgeNode = "edge-1"

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(runKubeEdge(m))
}

func runKubeEdge(m *testing.M) int {
	if testing.Short() {
		skipReason = "needs real KubeEdge nodes (run without -short)"
		return m.Run()
	}
	if err := realnode.CheckMachine(); err != nil {
		skipReason = "this machine cannot run real nodes: " + err.Error()
		return m.Run()
	}
	repo, err := testkit.RepoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := realnode.CheckKubeEdge(filepath.Join(repo, "bin")); err != nil {
		skipReason = "no KubeEdge: " + err.Error()
		return m.Run()
	}
	pause := filepath.Join(repo, "dist/images/samples/pause.tar")
	if _, err := os.Stat(pause); err != nil {
		fmt.Fprintln(os.Stderr, "real KubeEdge nodes: no pause image in dist/images: run make images-samples first")
		return 1
	}
	dir, err := os.MkdirTemp("", "llk-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	rc, err = realnode.Start(context.Background(), realnode.Options{Dir: dir, Images: []string{pause},
		Nodes: []realnode.NodeSpec{{Name: edgeNode, Role: realnode.RoleEdge, Daemon: realnode.DaemonEdgecore}}})
	if err != nil {
		fmt.Fprintln(os.Stderr, "real KubeEdge nodes:", err)
		if rc != nil {
			rc.Stop()
		}
		fmt.Fprintf(os.Stderr, "real KubeEdge nodes' logs kept in %s\n", dir)
		return 1
	}
	code := m.Run()
	rc.Stop()
	if code != 0 {
		fmt.Fprintf(os.Stderr, "real KubeEdge nodes' logs kept in %s (control-plane/*.log, nodes/*/var/log/pods)\n", dir)
	} else {
		_ = rc.Remove()
	}
	return code
}

func needKubeEdge(t testing.TB) {
	t.Helper()
	if skipReason != "" {
		t.Skip(skipReason)
	}
}

// The edge node runs a real edgecore configured as keadm join leaves it, MetaServer off and no feature gate; it
// joined cloudcore with its token, is Ready, and runs a pod the API server binds to it.
func TestEdgecoreNodeAsKeadmLeavesItRunsAPod(t *testing.T) {
	needKubeEdge(t)
	data, err := os.ReadFile(rc.Node(edgeNode).OnDisk(realnode.EdgecoreConfigPath))
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		FeatureGates map[string]bool `json:"featureGates"`
		Modules      struct {
			MetaManager struct {
				MetaServer struct {
					Enable bool `json:"enable"`
				} `json:"metaServer"`
			} `json:"metaManager"`
		} `json:"modules"`
	}
	if err := yaml.Unmarshal(data, &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.Modules.MetaManager.MetaServer.Enable || len(cfg.FeatureGates) > 0 {
		t.Errorf("edgecore's configuration: MetaServer on %t, feature gates %v; keadm leaves it off and none", cfg.Modules.MetaManager.MetaServer.Enable, cfg.FeatureGates)
	}

	ctx := context.Background()
	client := rc.Client()
	node, err := client.CoreV1().Nodes().Get(ctx, edgeNode, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, edge := node.Labels["node-role.kubernetes.io/edge"]; !edge {
		t.Errorf("node labels %v: want node-role.kubernetes.io/edge", node.Labels)
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "pinned", Namespace: "default"},
		Spec: corev1.PodSpec{NodeName: edgeNode, Containers: []corev1.Container{{Name: "pause", Image: "registry.k8s.io/pause:3.10",
			ImagePullPolicy: corev1.PullNever}}}}
	if _, err := client.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	testkit.Every(t, 200*time.Millisecond, 2*time.Minute, "the pinned pod Running on the edgecore node", func(ctx context.Context) (bool, error) {
		got, err := client.CoreV1().Pods("default").Get(ctx, "pinned", metav1.GetOptions{})
		return err == nil && got.Status.Phase == corev1.PodRunning, err
	})
	t.Logf("the pod ran %.1f s after its creation", time.Since(began).Seconds())
}
