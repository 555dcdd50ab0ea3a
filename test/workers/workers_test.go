package main

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
	"github.com/lifeline-edge/lifeline/test/testkit"
)

// lcStandIn records what workers post to their LC endpoint, by path.
type lcStandIn struct {
	mu      sync.Mutex
	paths   []string
	reports []map[string]any
}

func newLC(t *testing.T) (*lcStandIn, string) {
	lc := &lcStandIn{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var rep map[string]any
		if r.Method != http.MethodPost || json.Unmarshal(body, &rep) != nil {
			http.Error(w, "bad report", http.StatusBadRequest)
			return
		}
		lc.mu.Lock()
		lc.paths, lc.reports = append(lc.paths, r.URL.Path), append(lc.reports, rep)
		lc.mu.Unlock()
		_, _ = w.Write([]byte(`{"status": 200, "message": "OK"}`))
	}))
	t.Cleanup(srv.Close)
	return lc, srv.URL
}

func (lc *lcStandIn) wait(t *testing.T, n int) ([]string, []map[string]any) {
	t.Helper()
	testkit.Until(t, 20*time.Second, strconv.Itoa(n)+" reports", func() bool {
		lc.mu.Lock()
		defer lc.mu.Unlock()
		return len(lc.reports) >= n
	})
	lc.mu.Lock()
	defer lc.mu.Unlock()
	return append([]string(nil), lc.paths...), append([]map[string]any(nil), lc.reports...)
}

func keys(m any) []string {
	obj, _ := m.(map[string]any)
	var out []string
	for k := range obj {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func envOf(vars map[string]string) contractEnv {
	return contractEnv{
		get:    func(k string) string { return vars[k] },
		lookup: func(k string) (string, bool) { v, ok := vars[k]; return v, ok },
	}
}

func freePort(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
}

// The edge model reports what Sedna's LCReporter sends, to the same path: no status, empty results, the
// counters and times in ownerInfo, and ownerName "sedna" (its pod sets SERVICE_NAME, not JOB_NAME).
func TestLittleModelReportsAsSednaLibrary(t *testing.T) {
	lc, lcURL := newLC(t)
	big := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(`{"label":"helmet"}`))
	}))
	t.Cleanup(big.Close)
	host, port, _ := net.SplitHostPort(big.Listener.Addr().String())
	go func() {
		_ = runLittleModel(envOf(map[string]string{"BIG_MODEL_IP": host, "BIG_MODEL_PORT": port, "LC_SERVER": lcURL, "LC_PERIOD": "1",
			"WORKER_NAME": "helmet-deployment-edge", "NAMESPACE": "ns", "SERVICE_NAME": "helmet"}))
	}()
	paths, reports := lc.wait(t, 1)
	rep := reports[0]
	if paths[0] != "/sedna/workers/helmet-deployment-edge/info" {
		t.Errorf("posted to %s", paths[0])
	}
	if got, want := keys(rep), []string{"kind", "name", "namespace", "ownerInfo", "ownerKind", "ownerName", "results"}; !reflect.DeepEqual(got, want) {
		t.Errorf("body keys %v, want %v", got, want)
	}
	if rep["name"] != "helmet-deployment-edge" || rep["namespace"] != "ns" || rep["ownerName"] != "sedna" ||
		rep["ownerKind"] != "jointinferenceservice" || rep["kind"] != "inference" || !reflect.DeepEqual(rep["results"], []any{}) {
		t.Errorf("report %v", rep)
	}
	info := rep["ownerInfo"].(map[string]any)
	if got, want := keys(info), []string{"hardExampleNumber", "inferenceNumber", "startTime", "updateTime", "uploadCloudRatio"}; !reflect.DeepEqual(got, want) {
		t.Errorf("ownerInfo keys %v, want %v", got, want)
	}
	if _, err := time.Parse(lifelinev1.TimeLayout, info["updateTime"].(string)); err != nil {
		t.Errorf("updateTime: %v", err)
	}
}

// A trainer reports each round as Sedna's FederatedLearning.train does: the round and samples in ownerInfo,
// the saved model as results of {format, url, metrics} with no round, "running" and then "completed".
func TestTrainerReportsAsSednaLibrary(t *testing.T) {
	lc, lcURL := newLC(t)
	dataset := filepath.Join(t.TempDir(), "train.txt")
	if err := os.WriteFile(dataset, []byte("a.jpg 1\nb.jpg 0\nc.jpg 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	go func() {
		_ = runAggregator(envOf(map[string]string{"AGG_BIND_PORT": port, "PARTICIPANTS_COUNT": "1", "exit_round": "2"}))
	}()
	err := runTrainer(envOf(map[string]string{"AGG_IP": "127.0.0.1", "AGG_PORT": port, "WORKER_NAME": "job-trainworker-0",
		"NAMESPACE": "ns", "JOB_NAME": "job", "LC_SERVER": lcURL, "TRAIN_DATASET_URL": dataset, "MODEL_URL": "/home/data/model"}))
	if err != nil {
		t.Fatal(err)
	}
	paths, reports := lc.wait(t, 2)
	if len(reports) != 2 {
		t.Fatalf("%d reports, want one per round: %v", len(reports), reports)
	}
	for i, rep := range reports {
		if paths[i] != "/sedna/workers/job-trainworker-0/info" {
			t.Errorf("posted to %s", paths[i])
		}
		if got, want := keys(rep), []string{"kind", "name", "namespace", "ownerInfo", "ownerKind", "ownerName", "results", "status"}; !reflect.DeepEqual(got, want) {
			t.Errorf("body keys %v, want %v", got, want)
		}
		wantStatus := []string{"running", "completed"}[i]
		if rep["ownerName"] != "job" || rep["ownerKind"] != "default" || rep["kind"] != "train" || rep["status"] != wantStatus {
			t.Errorf("report %d: %v, want status %s", i, rep, wantStatus)
		}
		info := rep["ownerInfo"].(map[string]any)
		if got, want := keys(info), []string{"currentRound", "sampleCount", "startTime", "updateTime"}; !reflect.DeepEqual(got, want) {
			t.Errorf("ownerInfo keys %v, want %v", got, want)
		}
		if info["currentRound"] != float64(i+1) || info["sampleCount"] != float64(3) {
			t.Errorf("ownerInfo %v, want round %d of 3 samples", info, i+1)
		}
		results := rep["results"].([]any)
		if len(results) != 1 || !reflect.DeepEqual(keys(results[0]), []string{"format", "metrics", "url"}) {
			t.Errorf("results %v, want one {format, metrics, url}", results)
		}
	}
}

func TestOwnerNameAsSednaLibrary(t *testing.T) {
	for _, c := range []struct {
		name string
		env  map[string]string
		want string
	}{
		{"JOB_NAME set", map[string]string{"JOB_NAME": "job", "SERVICE_NAME": "svc"}, "job"},
		{"only SERVICE_NAME: the library's default JOB_NAME", map[string]string{"SERVICE_NAME": "svc"}, "sedna"},
		{"JOB_NAME empty", map[string]string{"JOB_NAME": "", "SERVICE_NAME": "svc"}, "svc"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := envOf(c.env).ownerName(); got != c.want {
				t.Errorf("ownerName %q, want %q", got, c.want)
			}
		})
	}
}

// A report the LC endpoint does not take (an agent restarting) is tried again as Sedna's library tries it, and
// delivered once the endpoint answers; one no attempt delivers is given up, and the worker goes on.
func TestReportIsTriedAgainAsSednaLibraryDoes(t *testing.T) {
	retry := reportRetry{attempts: sednaRetry.attempts, spacing: 10 * time.Millisecond}
	var mu sync.Mutex
	failFirst, calls := 0, 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		calls++
		if calls <= failFirst {
			http.Error(w, "restarting", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte(`{"status": 200, "message": "OK"}`))
	}))
	defer srv.Close()
	for _, tc := range []struct {
		failFirst, wantCalls int
		delivered            bool
	}{
		{0, 1, true},
		{3, 4, true},
		{4, 5, true},
		{5, 5, false}, // every attempt refused: lost
	} {
		mu.Lock()
		failFirst, calls = tc.failFirst, 0
		mu.Unlock()
		err := reportWithRetry(retry, srv.URL, lifelinev1.Report{Name: "w"})
		mu.Lock()
		got := calls
		mu.Unlock()
		if (err == nil) != tc.delivered || got != tc.wantCalls {
			t.Errorf("refused %d times: %d attempts, error %v; want %d attempts, delivered %v", tc.failFirst, got, err, tc.wantCalls, tc.delivered)
		}
	}
}
