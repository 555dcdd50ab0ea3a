package harness

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/lifeline-edge/lifeline/test/testkit"
)

var shared *ControlPlane

func TestMain(m *testing.M) {
	os.Exit(RunTests(m, ControlPlaneOptions{}, func(cp *ControlPlane) error { shared = cp; return nil }))
}

func adminClient(t *testing.T) kubernetes.Interface {
	t.Helper()
	SkipIfShort(t)
	c, err := shared.Client()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func testNamespace(t *testing.T, c kubernetes.Interface) string {
	t.Helper()
	ns, err := c.CoreV1().Namespaces().Create(context.Background(),
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "cluster-test-"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating namespace: %v", err)
	}
	t.Cleanup(func() {
		_ = c.CoreV1().Namespaces().Delete(context.Background(), ns.Name, metav1.DeleteOptions{})
	})
	return ns.Name
}

func TestAPIServerAnswersAndAcceptsANode(t *testing.T) {
	c := adminClient(t)
	ctx := context.Background()
	version, err := c.Discovery().ServerVersion()
	if err != nil {
		t.Fatalf("server version: %v", err)
	}
	if !strings.HasPrefix(version.GitVersion, "v1.37.") {
		t.Errorf("server version %q, want the pinned v1.37.x", version.GitVersion)
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{
		Name:   "cluster-test-node",
		Labels: map[string]string{"node-role.kubernetes.io/edge": ""},
	}}
	if _, err := c.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating node: %v", err)
	}
	t.Cleanup(func() { _ = c.CoreV1().Nodes().Delete(ctx, node.Name, metav1.DeleteOptions{}) })
	got, err := c.CoreV1().Nodes().Get(ctx, node.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("reading node back: %v", err)
	}
	if _, ok := got.Labels["node-role.kubernetes.io/edge"]; !ok {
		t.Errorf("node labels %v lost the edge role", got.Labels)
	}
}

func TestGarbageCollectorCascades(t *testing.T) {
	c := adminClient(t)
	ctx := context.Background()
	ns := testNamespace(t, c)
	for _, policy := range []metav1.DeletionPropagation{metav1.DeletePropagationBackground, metav1.DeletePropagationForeground} {
		t.Run(string(policy), func(t *testing.T) {
			cms := c.CoreV1().ConfigMaps(ns)
			owner, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
				Name: "owner-" + strings.ToLower(string(policy))}}, metav1.CreateOptions{})
			if err != nil {
				t.Fatalf("creating owner: %v", err)
			}
			child, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
				Name: "child-" + strings.ToLower(string(policy)),
				OwnerReferences: []metav1.OwnerReference{{
					APIVersion: "v1", Kind: "ConfigMap", Name: owner.Name, UID: owner.UID,
					Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true),
				}},
			}}, metav1.CreateOptions{})
			if err != nil {
				t.Fatalf("creating child: %v", err)
			}
			if err := cms.Delete(ctx, owner.Name, metav1.DeleteOptions{PropagationPolicy: &policy}); err != nil {
				t.Fatalf("deleting owner: %v", err)
			}
			if policy == metav1.DeletePropagationForeground {
				// The owner stays, marked for deletion, until its blocking child is gone.
				got, err := cms.Get(ctx, owner.Name, metav1.GetOptions{})
				if err == nil && got.DeletionTimestamp == nil {
					t.Errorf("owner under foreground deletion has no deletionTimestamp")
				}
			}
			for _, name := range []string{child.Name, owner.Name} {
				testkit.UntilErr(t, 30*time.Second, name+" to be deleted", func(ctx context.Context) (bool, error) {
					_, err := cms.Get(ctx, name, metav1.GetOptions{})
					return apierrors.IsNotFound(err), nil
				})
			}
		})
	}
}

func TestDeploymentControllerCreatesReplicaSetAndPods(t *testing.T) {
	c := adminClient(t)
	ctx := context.Background()
	ns := testNamespace(t, c)
	labels := map[string]string{"app": "web"}
	d, err := c.AppsV1().Deployments(ns).Create(ctx, &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](2),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "web", Image: "web:1"}}},
			},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating deployment: %v", err)
	}
	var rsName string
	testkit.UntilErr(t, 30*time.Second, "a ReplicaSet owned by the Deployment", func(ctx context.Context) (bool, error) {
		rss, err := c.AppsV1().ReplicaSets(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		for _, rs := range rss.Items {
			if ref := metav1.GetControllerOf(&rs); ref != nil && ref.UID == d.UID {
				rsName = rs.Name
				return true, nil
			}
		}
		return false, nil
	})
	testkit.UntilErr(t, 30*time.Second, "two pods owned by the ReplicaSet", func(ctx context.Context) (bool, error) {
		pods, err := c.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		owned := 0
		for _, p := range pods.Items {
			if ref := metav1.GetControllerOf(&p); ref != nil && ref.Kind == "ReplicaSet" && ref.Name == rsName {
				owned++
			}
		}
		return owned == 2, nil
	})
}

func TestStartRejectsATakenPort(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port
	_, err = StartControlPlane(context.Background(), ControlPlaneOptions{BinDir: fakeBinDir(t, "sleep 60"), APIServerPort: port})
	if err == nil || !strings.Contains(err.Error(), "kube-apiserver port") || !strings.Contains(err.Error(), "not available") {
		t.Fatalf("Start with a taken API server port: got %v, want an error naming the kube-apiserver port", err)
	}
}

func TestStartNamesAMissingBinary(t *testing.T) {
	dir := t.TempDir()
	_, err := StartControlPlane(context.Background(), ControlPlaneOptions{BinDir: dir})
	if err == nil || !strings.Contains(err.Error(), "etcd not found in "+dir) || !strings.Contains(err.Error(), "make tools") {
		t.Fatalf("Start with an empty bin dir: got %v, want an error naming etcd and `make tools`", err)
	}
}

func TestStartReportsAComponentThatDies(t *testing.T) {
	began := time.Now()
	_, err := StartControlPlane(context.Background(), ControlPlaneOptions{
		BinDir:       fakeBinDir(t, `echo "listen tcp 127.0.0.1:2379: bind: address already in use"; exit 1`),
		StartTimeout: time.Minute,
	})
	if err == nil || !strings.Contains(err.Error(), "etcd exited") || !strings.Contains(err.Error(), "address already in use") {
		t.Fatalf("Start with a dying etcd: got %v, want an error naming etcd and quoting its log", err)
	}
	if took := time.Since(began); took > 20*time.Second {
		t.Errorf("Start took %v to notice a dead child, want it at once", took)
	}
}

func TestStartTimesOutAndLeavesNoProcess(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "pid")
	_, err := StartControlPlane(context.Background(), ControlPlaneOptions{
		BinDir:       fakeBinDir(t, "echo $$ > "+pidFile+"; exec sleep 600"),
		StartTimeout: 2 * time.Second,
	})
	if err == nil || !strings.Contains(err.Error(), "timed out waiting for etcd /health") {
		t.Fatalf("Start with an etcd that never answers: got %v, want a timeout naming etcd", err)
	}
	data, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatalf("the fake etcd never ran: %v", err)
	}
	var pid int
	if _, err := fmt.Sscan(string(data), &pid); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, 0); err != syscall.ESRCH {
		t.Errorf("process %d of the failed start is still there (kill 0: %v)", pid, err)
	}
}

// fakeBinDir writes a shell script under every control-plane binary name; each runs body.
func fakeBinDir(t *testing.T, body string) string {
	t.Helper()
	dir := t.TempDir()
	for _, name := range []string{EtcdBinary, APIServerBinary, ControllerManagerBinary, SchedulerBinary} {
		script := "#!/bin/sh\n" + body + "\n"
		if err := os.WriteFile(filepath.Join(dir, name), []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}
