package main

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/protobuf/proto"

	"github.com/lifeline-edge/lifeline/edge/cloudlink"
	"github.com/lifeline-edge/lifeline/edge/desired"
	"github.com/lifeline-edge/lifeline/edge/standin"
	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
	"github.com/lifeline-edge/lifeline/test/testkit"
)

// The standby reads no API server: its workers are those the agent pod left on the node's disk, it rebuilds them
// (they came from the agent pod's authenticated source), and the node reaches the API server when its own probe
// says so.
func TestStandbyWorksFromTheDesiredWorkersOnDiskAndItsProbe(t *testing.T) {
	stateDir, staticDir := t.TempDir(), t.TempDir()
	kept, _ := json.Marshal([]desired.Worker{{Namespace: "default", Name: "trainer", UID: "u1"}})
	if err := os.WriteFile(filepath.Join(stateDir, "desired-workers.json"), kept, 0o600); err != nil {
		t.Fatal(err)
	}
	cloud := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	probe := &cloudlink.Probe{URL: cloud.URL}
	src, err := StandbySources("edge-1", stateDir, staticDir, "", nil, probe, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	if got := src.Workers.Workers(); len(got) != 1 || got[0].UID != "u1" {
		t.Errorf("workers %v, want the one on disk", got)
	}
	if r, ok := src.Rebuilder.(*standin.StaticPods); !ok || r.Dir != staticDir {
		t.Errorf("rebuilder %#v, want static pods in %s", src.Rebuilder, staticDir)
	}
	if src.RunProbe || src.PodSourceURL != "none (the standby)" || src.ActuatorURL != "" {
		t.Errorf("sources %+v: the standby's probe runs already, and it has no pod source nor MetaServer", src)
	}
	if src.APIKnown() {
		t.Error("reachability known before the probe answered")
	}
	ctx, cancel := context.WithCancel(context.Background())
	probe.Period = 10 * time.Millisecond
	go probe.Run(ctx)
	testkit.Until(t, 5*time.Second, "the probe's answer", src.APIKnown)
	if !src.APIReachable() {
		t.Error("the cloud answers the probe, but the node is not taken as reaching it")
	}
	cancel()
	cloud.Close()
}

// The agent pod reads its pods where its flags say, rebuilds only from an authenticated source, and with a probe
// reaches the API server only while both its watch and its probe answer.
func TestAgentPodSourcesFollowTheFlags(t *testing.T) {
	stateDir, staticDir := t.TempDir(), t.TempDir()
	flags := PodSourceFlags{APIServer: "http://127.0.0.1:1", APIServerExplicit: true, MetaServer: "http://127.0.0.1:1",
		StaticDir: staticDir, CloudProbe: "https://127.0.0.1:1/readyz"}
	src, err := PodSources("edge-1", stateDir, nil, flags, logr.Discard(), logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	if src.Rebuilder != nil {
		t.Error("a plain HTTP pod source may choose what the agent rebuilds")
	}
	if src.Probe == nil || !src.RunProbe || src.Probe.URL != flags.CloudProbe {
		t.Errorf("probe %+v (runs: %v), want the flag's, run by the agent", src.Probe, src.RunProbe)
	}
	if src.PodSourceURL != "http://127.0.0.1:1" {
		t.Errorf("pod source %q", src.PodSourceURL)
	}
	if src.APIReachable() || src.APIKnown() {
		t.Error("reachable before the watch or the probe answered")
	}
	flags.AllowInsecurePods = true
	if src, err = PodSources("edge-1", stateDir, nil, flags, logr.Discard(), logr.Discard()); err != nil || src.Rebuilder == nil {
		t.Errorf("with --allow-insecure-pod-source: rebuilder %v, %v", src.Rebuilder, err)
	}
}

// [P-DES-1] On a node as keadm leaves it (edgecore's configuration given, its MetaServer off, no address named),
// the agent's workers are the controller's word: a process answering at the MetaServer's address with a pod of
// its own is never read, and the word is trusted for rebuilds only over TLS.
func TestKeadmNodeReadsTheControllersWordNotTheMetaServersAddress_P_DES_1(t *testing.T) {
	var squatted atomic.Int32
	squatter := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		squatted.Add(1)
		_, _ = w.Write([]byte(`{"metadata":{"resourceVersion":"1"},"items":[{"metadata":{"namespace":"default","name":"evil","uid":"evil",` +
			`"labels":{"lifeline.sedna.io/role":"edge"}},"spec":{"nodeName":"edge-1","hostPID":true,"containers":[{"name":"c","image":"x"}]}}]}`))
	}))
	defer squatter.Close()
	config := filepath.Join(t.TempDir(), "edgecore.yaml")
	if err := os.WriteFile(config, []byte("modules:\n  metaManager:\n    metaServer:\n      enable: false\n      server: "+
		strings.TrimPrefix(squatter.URL, "http://")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	flags := PodSourceFlags{APIServer: squatter.URL, MetaServer: squatter.URL, EdgecoreConfig: config, StaticDir: t.TempDir()}
	if !flags.UsesControllerWord(PodSourceAuto) {
		t.Fatal("--pod-source=auto on a KubeEdge node does not read the controller's word")
	}
	for _, overTLS := range []bool{false, true} {
		flags.Word = &desired.ControllerWord{Node: "edge-1", OverTLS: overTLS, Session: func() (uint64, bool) { return 1, true }}
		src, err := PodSources("edge-1", t.TempDir(), nil, flags, logr.Discard(), logr.Discard())
		if err != nil {
			t.Fatal(err)
		}
		if (src.Rebuilder != nil) != overTLS {
			t.Errorf("over TLS %t: rebuilder %v, want one only over TLS", overTLS, src.Rebuilder)
		}
		set, _ := proto.Marshal(&lifelinev1.DesiredWorkers{Node: "edge-1", BirthSeq: 1, Revision: 1, Workers: []*lifelinev1.DesiredWorker{{PodUid: "u1",
			Manifest: []byte(`{"apiVersion":"v1","kind":"Pod","metadata":{"namespace":"default","name":"w","labels":{"lifeline.sedna.io/role":"edge"}},"spec":{"containers":[{"name":"c","image":"w"}]}}`)}}})
		if err := flags.Word.Offer(1, set); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { src.Workers.Run(ctx, 10*time.Millisecond); close(done) }()
		testkit.Until(t, 5*time.Second, "the controller's worker", func() bool { return src.Workers.Has("u1") })
		cancel()
		<-done
		if src.Workers.Has("evil") || squatted.Load() != 0 {
			t.Errorf("the process at the MetaServer's address was read %d times (its pod a worker: %t)", squatted.Load(), src.Workers.Has("evil"))
		}
	}
	for _, given := range []PodSourceFlags{{APIServerExplicit: true, EdgecoreConfig: config}, {InCluster: true, EdgecoreConfig: config},
		{MetaServerExplicit: true, EdgecoreConfig: config}} {
		if given.UsesControllerWord(PodSourceAuto) {
			t.Errorf("flags %+v: the controller's word, though a source is named", given)
		}
	}
}
