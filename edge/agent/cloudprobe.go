package agent

import (
	"context"
	"crypto/tls"
	"io"
	"net/http"
	"sync/atomic"
	"time"
)

// CloudProbe tells whether the node reaches the cloud by a request to a URL there: the API server's /healthz, or
// the cloudcore endpoint edgecore's edgeHub connects to. Any HTTP answer counts: only the round trip matters. It
// is needed when the agent reads its workers from KubeEdge's MetaServer, which answers from the node's own store
// whether or not the cloud is reachable.
type CloudProbe struct {
	URL string
	// Timeout of one attempt (default 1 s).
	Timeout time.Duration

	reachable atomic.Bool
}

// Run probes every interval until ctx ends.
func (p *CloudProbe) Run(ctx context.Context, interval time.Duration) {
	timeout := p.Timeout
	if timeout == 0 {
		timeout = time.Second
	}
	// Nothing read from the answer is trusted, so the peer's certificate is not checked: cloudcore's is signed
	// by its own CA, which the agent does not have.
	client := &http.Client{Timeout: timeout, Transport: &http.Transport{
		TLSClientConfig:   &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // reachability only
		DisableKeepAlives: true,
	}}
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.URL, nil)
		if err == nil {
			var resp *http.Response
			if resp, err = client.Do(req); err == nil {
				_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
				resp.Body.Close()
			}
		}
		p.reachable.Store(err == nil)
		select {
		case <-ctx.Done():
			return
		case <-time.After(interval):
		}
	}
}

// Reachable tells the outcome of the latest attempt.
func (p *CloudProbe) Reachable() bool { return p.reachable.Load() }
