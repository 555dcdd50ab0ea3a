package manager_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/lifeline-edge/lifeline/cloud/manager"
	"github.com/lifeline-edge/lifeline/test/harness"
	"github.com/lifeline-edge/lifeline/test/testkit"
)

// The controller's metrics, served as the chart serves them (--metrics-secure): a scrape without a token is
// refused, one with a token the API server does not authorize for /metrics is forbidden, and one of a service
// account bound to a ClusterRole that may get /metrics gets them, the embedded broker's sessions among them; every
// metric served passes promlint.
func TestMetricsAreServedToAuthorizedScrapersOnly(t *testing.T) {
	addr := harness.FreeAddr(t)
	mgr, err := manager.New(cp.Config, manager.Options{MetricsAddr: addr, MetricsSecure: true, HealthAddr: "0", Restartable: true,
		MQTTAddress: harness.FreeAddr(t), MQTTCredentialsDir: t.TempDir(), Cluster: "c"})
	if err != nil {
		t.Fatal(err)
	}
	runManager(t, mgr)

	cs := kubernetes.NewForConfigOrDie(cp.Config)
	ctx := context.Background()
	reader := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "metrics-reader-test"},
		Rules: []rbacv1.PolicyRule{{NonResourceURLs: []string{"/metrics"}, Verbs: []string{"get"}}}}
	if _, err := cs.RbacV1().ClusterRoles().Create(ctx, reader, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.RbacV1().ClusterRoles().Delete(ctx, reader.Name, metav1.DeleteOptions{}) })
	token := func(name string) string {
		t.Helper()
		sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name}}
		if _, err := cs.CoreV1().ServiceAccounts("default").Create(ctx, sa, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cs.CoreV1().ServiceAccounts("default").Delete(ctx, name, metav1.DeleteOptions{}) })
		tr, err := cs.CoreV1().ServiceAccounts("default").CreateToken(ctx, name, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return tr.Status.Token
	}
	scraper, stranger := token("prometheus-test"), token("stranger-test")
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "metrics-reader-test"},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: reader.Name},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: "default", Name: "prometheus-test"}}}
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.RbacV1().ClusterRoleBindings().Delete(ctx, binding.Name, metav1.DeleteOptions{}) })

	// The certificate is the controller's own; the token is what is checked.
	httpc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec
	scrape := func(token string) (int, string, error) {
		req, err := http.NewRequest(http.MethodGet, "https://"+addr+"/metrics", nil)
		if err != nil {
			return 0, "", err
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := httpc.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body), err
	}
	var code int
	var body string
	testkit.Until(t, 10*time.Second, "the bound service account's scrape served", func() bool {
		code, body, err = scrape(scraper)
		return err == nil && code == http.StatusOK && strings.Contains(body, "lifeline_edge_nodes") &&
			strings.Contains(body, "lifeline_broker_max_sessions 1000")
	})
	for _, c := range []struct {
		name, token string
		want        int
	}{
		{"no token", "", http.StatusUnauthorized},
		{"a token not authorized for /metrics", stranger, http.StatusForbidden},
		// The API server's TokenReview fails on it; controller-runtime's filter answers that with 500.
		{"a forged token", "forged", http.StatusInternalServerError},
	} {
		if code, got, err := scrape(c.token); err != nil || code != c.want || strings.Contains(got, "lifeline_") {
			t.Errorf("%s: %d %v, want %d and no metric", c.name, code, err, c.want)
		}
	}
	for _, name := range chartMetricNames(t) {
		if !strings.Contains(body, "# TYPE "+name+" ") {
			t.Errorf("the chart's alerts or dashboard read %s, which the controller does not serve", name)
		}
	}
	problems, err := promlint.New(strings.NewReader(body)).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
}

// chartMetricNames are the metrics the chart's alert rules and Grafana dashboard read from the controller: every
// name in their expressions, histogram series under their family's name.
func chartMetricNames(t *testing.T) []string {
	t.Helper()
	chart := "../../deploy/chart/lifeline/"
	var exprs []string
	rules, err := os.ReadFile(chart + "templates/controller-metrics.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile(`(?m)^\s*expr: (.*)$`).FindAllStringSubmatch(string(rules), -1) {
		exprs = append(exprs, m[1])
	}
	raw, err := os.ReadFile(chart + "dashboards/lifeline.json")
	if err != nil {
		t.Fatal(err)
	}
	var board struct {
		Panels []struct{ Targets []struct{ Expr string } }
	}
	if err := json.Unmarshal(raw, &board); err != nil {
		t.Fatal(err)
	}
	for _, p := range board.Panels {
		for _, target := range p.Targets {
			exprs = append(exprs, target.Expr)
		}
	}
	seen := map[string]bool{}
	var names []string
	metric := regexp.MustCompile(`\b(lifeline_|controller_runtime_|workqueue_|process_|go_)[a-z0-9_]+\b`)
	for _, e := range exprs {
		for _, name := range metric.FindAllString(e, -1) {
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				name = strings.TrimSuffix(name, suffix)
			}
			if !seen[name] {
				seen[name] = true
				names = append(names, name)
			}
		}
	}
	if len(names) < 10 {
		t.Fatalf("found only %v in the chart's alerts and dashboard", names)
	}
	return names
}
