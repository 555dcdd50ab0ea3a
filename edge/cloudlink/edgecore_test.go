package cloudlink

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/yaml"

	"github.com/lifeline-edge/lifeline/test/testkit"
)

// realEdgecore is the edgecore that make tools builds from KubeEdge's own source; the test skips, saying why,
// where there is none.
func realEdgecore(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("LIFELINE_BIN_DIR")
	if dir == "" {
		root, err := testkit.RepoRoot()
		if err != nil {
			t.Fatal(err)
		}
		dir = filepath.Join(root, "bin")
	}
	edgecore := filepath.Join(dir, "edgecore")
	if _, err := os.Stat(edgecore); err != nil {
		t.Skipf("no real edgecore (%v): make tools builds it from KubeEdge's source archive, ../shared/kubeedge/kubeedge-*.tar.xz beside the clone", err)
	}
	return edgecore
}

// TestEdgecoreMetaServer and the probe's tests read configurations written by hand. Here the same readers take the
// real edgecore's own default configuration, which keadm join starts from and leaves the MetaServer off in, and
// then that configuration as an operator turns the MetaServer and requireAuthorization on.
func TestAgentReadsTheRealEdgecoresConfiguration(t *testing.T) {
	out, err := exec.Command(realEdgecore(t), "--defaultconfig").Output()
	if err != nil {
		t.Fatalf("edgecore --defaultconfig: %v", err)
	}
	path := filepath.Join(t.TempDir(), "edgecore.yaml")
	write := func(data []byte) {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(out)
	ep, err := EdgecoreMetaServer(path)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(MetaServerEndpoint{URL: "http://127.0.0.1:10550"}, ep); diff != "" {
		t.Errorf("the MetaServer of edgecore's default configuration (-want +got):\n%s", diff)
	}
	var config map[string]any
	if err := yaml.Unmarshal(out, &config); err != nil {
		t.Fatal(err)
	}
	// edgecore puts the host's own address there; keadm join, the cloud's.
	httpServer, _ := objectAt(objectAt(config, "modules"), "edgeHub")["httpServer"].(string)
	probe, _, err := EdgecoreProbe(path)
	if err != nil {
		t.Fatal(err)
	}
	if httpServer == "" || probe.URL != httpServer+"/ca.crt" {
		t.Errorf("probe of edgecore's default configuration %s, want cloudcore's HTTPS server at modules.edgeHub.httpServer %q", probe.URL, httpServer)
	}

	metaServer := objectAt(objectAt(objectAt(config, "modules"), "metaManager"), "metaServer")
	metaServer["enable"] = true
	objectAt(config, "featureGates")["requireAuthorization"] = true
	edited, err := yaml.Marshal(config)
	if err != nil {
		t.Fatal(err)
	}
	write(edited)
	if ep, err = EdgecoreMetaServer(path); err != nil {
		t.Fatal(err)
	}
	want := MetaServerEndpoint{Enabled: true, URL: "https://127.0.0.1:10550", CAFile: MetaServerCAFile}
	if diff := cmp.Diff(want, ep); diff != "" {
		t.Errorf("the MetaServer turned on, with requireAuthorization (-want +got):\n%s", diff)
	}
}

// objectAt is the object under key in m, made when there is none (as the stand-ins' manifests are edited).
func objectAt(m map[string]any, key string) map[string]any {
	object, _ := m[key].(map[string]any)
	if object == nil {
		object = map[string]any{}
		m[key] = object
	}
	return object
}
