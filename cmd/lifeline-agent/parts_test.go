package main

import (
	"context"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/lifeline-edge/lifeline/edge/desired"
	"github.com/lifeline-edge/lifeline/edge/standin"
	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
	"github.com/lifeline-edge/lifeline/test/testkit"
)

// Item 7 of the third hardening round: a probe URL given explicitly was never certificate-checked, so whoever is
// on the path could answer it and keep a cut-off node looking connected. It is checked against the CA given (or
// the system's), and a URL that cannot be checked is refused.
func TestExplicitProbeURLIsCheckedAgainstItsCA(t *testing.T) {
	cloud := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer cloud.Close()
	ca := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cloud.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	answered := func(caFile string) bool {
		probe, err := ChooseProbe(cloud.URL+"/healthz", caFile, false, "", logr.Discard())
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go probe.Run(ctx)
		testkit.Until(t, 10*time.Second, "an attempt", probe.Probed)
		return probe.Reachable()
	}
	if !answered(ca) {
		t.Error("the cloud, checked against its CA, does not answer")
	}
	if answered("") {
		t.Error("a server whose certificate no system CA signed keeps the node looking connected")
	}
	if _, err := ChooseProbe("http://cloud.example/healthz", "", false, "", logr.Discard()); err == nil {
		t.Error("a plain-HTTP probe URL is taken")
	}
}

// An attacker on the node binds the MetaServer's port while edgecore restarts, serves a privileged pod with the
// node's root mounted as one of the node's workers, and stops answering so the node looks cut off. With the
// chart's plain-HTTP source the agent does not rebuild at all; told to trust plain HTTP, it still writes no
// manifest of the attacker's.
func TestHostileMetaServerStandInGetsNoManifestWritten(t *testing.T) {
	hostile := `{"metadata":{"namespace":"default","name":"fl-trainer-0","uid":"u-evil","labels":{"` + lifelinev1.RoleLabel + `":"trainer"}},
"spec":{"nodeName":"edge-1","hostPID":true,"restartPolicy":"Never","volumes":[{"name":"root","hostPath":{"path":"/"}}],
"containers":[{"name":"x","image":"evil","securityContext":{"privileged":true},"volumeMounts":[{"name":"root","mountPath":"/host"}]}]}}`
	metaServer := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("watch") == "true" {
			http.Error(w, "gone", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintf(w, `{"metadata":{"resourceVersion":"1"},"items":[%s]}`, hostile)
	}))
	defer metaServer.Close()
	pods := desired.NewPodClient(metaServer.URL, nil, "")
	workers, err := desired.New(pods, "edge-1", t.TempDir(), logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go workers.Run(ctx, 50*time.Millisecond)
	testkit.Until(t, 10*time.Second, "the served pod a worker", func() bool { return workers.Has("u-evil") })
	staticDir := t.TempDir()
	if r := ChooseRebuilder(pods, staticDir, false, workers, standin.Bound{}, logr.Discard()); r != nil {
		t.Fatalf("rebuilder %T from a plain-HTTP source, want none unless told to trust it", r)
	}
	r := ChooseRebuilder(pods, staticDir, true, workers, standin.Bound{}, logr.Discard())
	if !r.Bound.Untrusted {
		t.Error("stand-ins read over plain HTTP are not held to the untrusted bound")
	}
	var refused *standin.RefusedManifestError
	if err := r.Rebuild(ctx, "default", "fl-trainer-0", "u-evil"); !errors.As(err, &refused) {
		t.Fatalf("rebuild: %v, want a refusal", err)
	}
	if files, _ := os.ReadDir(staticDir); len(files) != 0 {
		t.Errorf("static-pod directory holds %v, want nothing", files)
	}
	if https := desired.NewPodClient("https://127.0.0.1:10550", nil, ""); ChooseRebuilder(https, staticDir, false, workers, standin.Bound{}, logr.Discard()) == nil {
		t.Error("no rebuilder from an HTTPS source with its certificate checked")
	}
}
