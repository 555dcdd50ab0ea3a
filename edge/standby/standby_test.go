package standby

import (
	"context"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/go-logr/logr"
)

func TestTheStandbyActsOnlyWhileCutOffAndGivesWayToTheAgentPod(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		lock := NodeLock{Dir: dir}
		var cutOff, acting atomic.Bool
		var looks atomic.Int64
		// waitLooks lets the bubble's clock run until the standby has looked n more times, any of which could have
		// made it act, and what a look set off is done.
		waitLooks := func(n int64) {
			t.Helper()
			for until := looks.Load() + n; looks.Load() < until; {
				time.Sleep(standbyInterval) // the bubble's clock: one more look
				synctest.Wait()
			}
		}
		standby := &Runner{Lock: lock, Interval: standbyInterval, Log: logr.Discard(),
			CutOff: func() bool { looks.Add(1); return cutOff.Load() }}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		acts := make(chan struct{}, 10)
		go standby.Run(ctx, func(ctx context.Context) {
			acting.Store(true)
			acts <- struct{}{}
			<-ctx.Done()
			acting.Store(false)
		})

		waitLooks(5)
		if acting.Load() {
			t.Fatal("the standby acts while the node reaches the API server")
		}
		cutOff.Store(true)
		select {
		case <-acts:
		case <-time.After(5 * time.Second):
			t.Fatal("the standby does not act on a cut-off node without an agent pod")
		}
		if _, ok, _ := lock.TryUnasked(); ok {
			t.Fatal("the lock is free while the standby acts")
		}

		release, err := lock.Hold(ctx, logr.Discard())
		if err != nil {
			t.Fatal(err)
		}
		if acting.Load() {
			t.Fatal("the agent pod holds the node while the standby still acts")
		}
		if lock.PodWaiting() {
			t.Error("the agent pod still says it waits once it holds the node")
		}
		waitLooks(5)
		if acting.Load() {
			t.Fatal("the standby acts while the agent pod holds the node")
		}

		release()
		select {
		case <-acts:
		case <-time.After(5 * time.Second):
			t.Fatal("the standby does not act again once the agent pod is gone and the node still cut off")
		}
	})
}

// standbyInterval is how often the standby looks, on the bubble's clock.
const standbyInterval = 10 * time.Millisecond

func TestTheAgentPodTakesAFreeNodeAtOnce(t *testing.T) {
	lock := NodeLock{Dir: t.TempDir()}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	release, err := lock.Hold(ctx, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	if _, err := lock.Hold(ctx, logr.Discard()); err == nil {
		t.Fatal("a second agent pod holds the node too")
	}
}

// An update starts the new agent pod beside the old one: the old one ends its run and hands the node over, and
// takes it back, without asking, if the new one stops first (a new image that fails).
func TestAnAgentPodHandsTheNodeToItsSuccessorAndTakesItBackIfItStops(t *testing.T) {
	lock := NodeLock{Dir: t.TempDir()}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	runs := make(chan string, 10)
	served := make(chan error, 1)
	go func() {
		served <- lock.Serve(ctx, 10*time.Millisecond, logr.Discard(), func(ctx context.Context) error {
			runs <- "started"
			<-ctx.Done()
			runs <- "ended"
			return nil
		})
	}()
	next := func(want string) {
		t.Helper()
		select {
		case got := <-runs:
			if got != want {
				t.Fatalf("the old pod's run %s, want %s", got, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("the old pod's run not %s within 5 s", want)
		}
	}
	next("started")

	newCtx, newCancel := context.WithTimeout(ctx, 5*time.Second)
	defer newCancel()
	release, err := lock.Hold(newCtx, logr.Discard())
	if err != nil {
		t.Fatalf("the new pod does not get the node: %v", err)
	}
	next("ended")
	if lock.PodWaiting() {
		t.Error("a pod says it waits for the node after the hand-over: the old one must wait without asking")
	}
	select {
	case got := <-runs:
		t.Fatalf("the old pod's run %s while the new one holds the node", got)
	case <-time.After(100 * time.Millisecond): // ten of the old pod's looks
	}

	release()
	next("started")
	cancel()
	next("ended")
	if err := <-served; err != nil {
		t.Errorf("Serve ended with %v when its context did", err)
	}
}

func TestTheStandbyManifestIsRewrittenOnlyWhenItChanges(t *testing.T) {
	dir := t.TempDir()
	static := filepath.Join(dir, "manifests")
	if err := os.Mkdir(static, 0o700); err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(dir, "pod.yaml")
	write := func(s string) {
		if err := os.WriteFile(src, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	installed := filepath.Join(static, standbyManifestFile)
	write("kind: Pod # 1\n")
	if err := Install(src, static); err != nil {
		t.Fatal(err)
	}
	first, err := os.Stat(installed)
	if err != nil {
		t.Fatal(err)
	}
	if err := Install(src, static); err != nil {
		t.Fatal(err)
	}
	if again, _ := os.Stat(installed); !os.SameFile(first, again) {
		t.Error("the same manifest was written again: the kubelet would restart the standby")
	}
	write("kind: Pod # 2\n")
	if err := Install(src, static); err != nil {
		t.Fatal(err)
	}
	if data, _ := os.ReadFile(installed); string(data) != "kind: Pod # 2\n" {
		t.Errorf("installed %q after the manifest changed", data)
	}
	if matches, _ := filepath.Glob(filepath.Join(static, "lifeline-*.json")); len(matches) != 0 {
		t.Errorf("the standby's manifest is taken for a stand-in: %v", matches)
	}

	files := Files{Dir: filepath.Join(dir, "standby")}
	if err := os.MkdirAll(files.Dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := Remove(static, files); err != nil {
		t.Fatal(err)
	}
	for _, gone := range []string{installed, files.Dir} {
		if _, err := os.Stat(gone); !os.IsNotExist(err) {
			t.Errorf("%s is still there after the standby was removed", gone)
		}
	}
}

func TestTheStandbyProbesWhereTheAgentPodSaid(t *testing.T) {
	files := Files{Dir: t.TempDir()}
	if _, err := files.Probe("", ""); err == nil {
		t.Fatal("a standby with no address to probe starts")
	}
	if err := os.WriteFile(filepath.Join(files.Dir, standbyAPIServer), []byte("https://10.96.0.1:443\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	probe, err := files.Probe("", "")
	if err != nil {
		t.Fatal(err)
	}
	if probe.URL != "https://10.96.0.1:443/readyz" || probe.TLS == nil || probe.TLS.InsecureSkipVerify || probe.TLS.RootCAs != nil {
		t.Errorf("probe %s (TLS %v), want the address left, checked against the system's CAs without one left", probe.URL, probe.TLS)
	}
	if err := os.WriteFile(filepath.Join(files.Dir, standbyAPICA), []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := files.Probe("", ""); err == nil {
		t.Error("a CA that holds no certificate is accepted")
	}
	if probe, err := files.Probe("https://api.example:6443/readyz", ""); err == nil || probe != nil {
		t.Error("a bad CA is ignored when the probe's URL is given")
	}
}
