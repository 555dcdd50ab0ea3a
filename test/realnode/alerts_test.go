package realnode_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lifeline-edge/lifeline/test/harness"
	"github.com/lifeline-edge/lifeline/test/testkit"
)

// alertFor is the `for:` of the stock rules below, shortened from their 15 min and 1 h so the test sees them fire.
const alertFor = 15 * time.Second

// stockPodAlerts are kubernetes-mixin's pod alerts (kube-prometheus' "kubernetes-apps" group) as it writes them, but
// for their `for:`: KubePodNotReady (a pod Pending, Unknown or Failed, unless a Job owns it), KubeContainerWaiting and
// KubePodCrashLooping.
const stockPodAlerts = `groups:
- name: kubernetes-apps
  rules:
  - alert: KubePodCrashLooping
    expr: max_over_time(kube_pod_container_status_waiting_reason{reason="CrashLoopBackOff", job="kube-state-metrics"}[5m]) >= 1
    for: %[1]s
  - alert: KubePodNotReady
    expr: |
      sum by (namespace, pod, cluster) (
        max by (namespace, pod, cluster) (kube_pod_status_phase{job="kube-state-metrics", phase=~"Pending|Unknown|Failed"})
        * on (namespace, pod, cluster) group_left(owner_kind)
        topk by (namespace, pod, cluster) (1, max by (namespace, pod, owner_kind, cluster) (kube_pod_owner{owner_kind!="Job"}))
      ) > 0
    for: %[1]s
  - alert: KubeContainerWaiting
    expr: kube_pod_container_status_waiting_reason{reason!="CrashLoopBackOff", job="kube-state-metrics"} > 0
    for: %[1]s
`

// [U] Stock monitoring on a fleet with armed stand-ins: kube-state-metrics (built from its Go module) and Prometheus
// (Debian's) with kubernetes-mixin's pod alerts, against the real nodes with Lifeline installed as the chart has it
// (armed stand-ins on). With every worker healthy and its stand-in armed, no alert is pending or firing over a
// window longer than the alerts' `for:`; a pod that really is broken (its image cannot be pulled) fires the
// alerts it should, which shows the quiet is not the rules seeing nothing.
func TestStockPodAlertsStayQuietOnAFleetWithArmedStandIns(t *testing.T) {
	needReal(t)
	ksm := filepath.Join(rc.ControlPlane().BinDir, "kube-state-metrics")
	if _, err := os.Stat(ksm); err != nil {
		t.Fatalf("kube-state-metrics: %v (make tools builds it)", err)
	}
	jointInferenceReady(t)
	worker := edgeWorkerPod(t)
	harness.Eventually(t, 2*time.Minute, "the edge worker's stand-in armed, Running and not Ready", func(ctx context.Context) (bool, error) {
		err := rc.ArmedStandInQuiet(ctx, "default", worker.Name, "edge-1")
		return err == nil, err
	})
	prom := startMonitoring(t, ksm)
	harness.Eventually(t, time.Minute, "Prometheus reading kube-state-metrics' pod metrics", func(ctx context.Context) (bool, error) {
		n, err := prom.count(ctx, `kube_pod_owner{owner_kind="Node", pod=~"`+worker.Name+`-.*"}`)
		return n > 0, err
	})

	// The stand-in's mirror pod stays the one it was: no controller claims it and deletes it (a ReplicaSet whose
	// selector matched it would), for its node to make it again.
	armed, err := rc.ArmedStandIn(context.Background(), "default", worker.Name, "edge-1")
	if err != nil {
		t.Fatal(err)
	}
	testkit.Sample(t, time.Second, alertFor+10*time.Second, func(ctx context.Context) error {
		alerts, err := prom.alerts(ctx)
		if err == nil && len(alerts) > 0 {
			err = fmt.Errorf("alerts on a healthy fleet with armed stand-ins: %v", alerts)
		}
		if err != nil {
			return err
		}
		now, err := rc.ArmedStandIn(ctx, "default", worker.Name, "edge-1")
		if err == nil && now.UID != armed.UID {
			err = fmt.Errorf("the stand-in's mirror pod %s was made again (UID %s, then %s)", now.Name, armed.UID, now.UID)
		}
		return err
	})

	broken := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "broken-worker"},
		Spec: corev1.PodSpec{NodeName: "edge-1", Containers: []corev1.Container{{Name: "main", Image: "lifeline.invalid/broken:1"}}}}
	if err := kc.Create(context.Background(), broken); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = kc.Delete(context.Background(), broken) })
	want := []string{"KubeContainerWaiting default/broken-worker firing", "KubePodNotReady default/broken-worker firing"}
	var last []string
	harness.Eventually(t, alertFor+2*time.Minute, "the broken pod's alerts firing, and no other", func(ctx context.Context) (bool, error) {
		alerts, err := prom.alerts(ctx)
		last = alerts
		return slices.Equal(alerts, want), err
	})
	t.Logf("the broken pod's alerts: %v", last)
}

// monitoring is a Prometheus reading a kube-state-metrics of the real nodes' cluster.
type monitoring struct{ api string }

// startMonitoring starts kube-state-metrics (pods only) and Prometheus with stockPodAlerts, scraping and evaluating
// every second, both stopped when the test ends.
func startMonitoring(t *testing.T, ksm string) *monitoring {
	t.Helper()
	dir := t.TempDir()
	ksmPort, ksmTelemetry, promPort := testkit.FreePort(t), testkit.FreePort(t), testkit.FreePort(t)
	config := fmt.Sprintf(`global: {scrape_interval: 1s, evaluation_interval: 1s}
rule_files: [rules.yaml]
scrape_configs:
- job_name: kube-state-metrics
  static_configs: [{targets: ["127.0.0.1:%d"]}]
`, ksmPort)
	for name, content := range map[string]string{"prometheus.yaml": config, "rules.yaml": fmt.Sprintf(stockPodAlerts, alertFor)} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	startLogged(t, filepath.Join(dir, "kube-state-metrics.log"), ksm, "--kubeconfig="+rc.Kubeconfig, "--resources=pods",
		"--host=127.0.0.1", fmt.Sprintf("--port=%d", ksmPort), "--telemetry-host=127.0.0.1", fmt.Sprintf("--telemetry-port=%d", ksmTelemetry))
	startLogged(t, filepath.Join(dir, "prometheus.log"), "prometheus", "--config.file="+filepath.Join(dir, "prometheus.yaml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"), fmt.Sprintf("--web.listen-address=127.0.0.1:%d", promPort))
	return &monitoring{api: fmt.Sprintf("http://127.0.0.1:%d/api/v1/", promPort)}
}

// alerts are the alerts pending or firing, each as "<name> <namespace>/<pod> <state>", sorted.
func (m *monitoring) alerts(ctx context.Context) ([]string, error) {
	var out struct {
		Data struct {
			Alerts []struct {
				Labels map[string]string
				State  string
			}
		}
	}
	if err := m.get(ctx, "alerts", &out); err != nil {
		return nil, err
	}
	var alerts []string
	for _, a := range out.Data.Alerts {
		alerts = append(alerts, fmt.Sprintf("%s %s/%s %s", a.Labels["alertname"], a.Labels["namespace"], a.Labels["pod"], a.State))
	}
	slices.Sort(alerts)
	return alerts, nil
}

// count is the number of series a query returns.
func (m *monitoring) count(ctx context.Context, query string) (int, error) {
	var out struct {
		Data struct{ Result []json.RawMessage }
	}
	err := m.get(ctx, "query?query="+url.QueryEscape(query), &out)
	return len(out.Data.Result), err
}

func (m *monitoring) get(ctx context.Context, path string, into any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, m.api+path, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("prometheus %s: %s", path, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(into)
}

// startLogged runs binary with args, its output in logFile, until the test ends; a failed test logs the output's
// end.
func startLogged(t *testing.T, logFile, binary string, args ...string) {
	t.Helper()
	f, err := os.Create(logFile)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(binary, args...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", binary, err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		_ = f.Close()
		if out, _ := os.ReadFile(logFile); t.Failed() {
			t.Logf("%s's output ends:\n%s", filepath.Base(binary), out[max(0, len(out)-4000):])
		}
	})
}
