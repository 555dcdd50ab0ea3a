package cloudlink

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// Where the agent reaches the MetaServer on a keadm-joined node: plain HTTP on 127.0.0.1:10550 by default, HTTPS
// under the requireAuthorization feature gate; off unless metaServer.enable.
func TestEdgecoreMetaServer(t *testing.T) {
	cases := []struct {
		name, config string
		want         MetaServerEndpoint
	}{
		{"keadm's default: off", "modules:\n  metaManager:\n    metaServer:\n      enable: false\n",
			MetaServerEndpoint{URL: "http://127.0.0.1:10550"}},
		{"enabled", "modules:\n  metaManager:\n    metaServer:\n      enable: true\n      server: 127.0.0.1:10550\n",
			MetaServerEndpoint{Enabled: true, URL: "http://127.0.0.1:10550"}},
		{"enabled, another port", "modules:\n  metaManager:\n    metaServer:\n      enable: true\n      server: 127.0.0.1:10551\n",
			MetaServerEndpoint{Enabled: true, URL: "http://127.0.0.1:10551"}},
		{"requireAuthorization", "featureGates:\n  requireAuthorization: true\nmodules:\n  metaManager:\n    metaServer:\n      enable: true\n",
			MetaServerEndpoint{Enabled: true, URL: "https://127.0.0.1:10550", CAFile: "/etc/kubeedge/pki/metaserver/ca.crt"}},
		{"requireAuthorization off", "featureGates:\n  requireAuthorization: false\nmodules:\n  metaManager:\n    metaServer:\n      enable: true\n",
			MetaServerEndpoint{Enabled: true, URL: "http://127.0.0.1:10550"}},
	}
	for _, tc := range cases {
		path := filepath.Join(t.TempDir(), "edgecore.yaml")
		if err := os.WriteFile(path, []byte(tc.config), 0o600); err != nil {
			t.Fatal(err)
		}
		got, err := EdgecoreMetaServer(path)
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tc.name, diff)
		}
	}
	if _, err := EdgecoreMetaServer(filepath.Join(t.TempDir(), "missing.yaml")); err == nil {
		t.Error("a missing configuration read without error")
	}
}
