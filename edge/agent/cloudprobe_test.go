package agent

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/lifeline-edge/lifeline/test/netproxy"
)

// The probe follows the link: a proxy that is cut still accepts connections and closes them, which must not
// count as reachable.
func TestCloudProbeFollowsTheLink(t *testing.T) {
	cloud := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusUnauthorized) }))
	defer cloud.Close()
	link, err := netproxy.Start(cloud.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer link.Close()
	p := &CloudProbe{URL: "https://" + link.Addr() + "/healthz", Timeout: 500 * time.Millisecond}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go p.Run(ctx, 50*time.Millisecond)
	waitFor(t, 5*time.Second, "the cloud reachable (any answer counts)", p.Reachable)
	link.Cut()
	waitFor(t, 5*time.Second, "the cloud unreachable", func() bool { return !p.Reachable() })
	link.Restore()
	waitFor(t, 5*time.Second, "the cloud reachable again", p.Reachable)
}
